"""Lifelines (_hosts/_lifeline.py): heartbeats between the controller and its agents that a held
controller event loop does not stop, and that a cut link still does.

Real agents and workers, in network namespaces where this machine can make them (as in
test_multihost.py), over localhost otherwise.
"""

from __future__ import annotations

import logging
import select
import socket
import time
from typing import Any

import pytest
import trio

import otpmesh
from otpmesh import LogKind
from otpmesh._hosts._cluster import HOST_TIMEOUT
from otpmesh._hosts._lifeline import BEAT, Lifeline, Lifelines, is_beat
from otpmesh._wire import _codec
from otpmesh._wire._framemac import FrameMac
from otpmesh._wire._frames import HELLO
from otpmesh._wire._framing import FrameDecoder, frame_header
from otpmesh._wire._handshake import dial
from tests.conftest import alive, run_trio
from tests.test_multihost import _restarts, _tree, cluster_secret, spaces, where

__all__ = ["cluster_secret", "spaces", "where"]  # fixtures, used by name


async def _lifelines_up(hosts: otpmesh.Cluster) -> None:
    with trio.fail_after(30):  # a hang guard, not a deadline
        while any(h.lifeline is None for h in hosts.live):
            await trio.sleep(0.02)


async def _identities(app: otpmesh.App) -> list[tuple[int, str]]:
    """Every worker's (pid, host), by rank."""
    return [(w["pid"], w["host"]) for w in (await app.mesh("root/workers").whoami()).values()]


@pytest.mark.parametrize("hold", ["sleep", "spin"])
def test_a_held_controller_loop_kills_no_remote_worker(
    where: Any, hold: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A driver's synchronous step holds the controller's loop for 3 x HOST_TIMEOUT (blocked in
    a call, or running Python code): no agent fences, no host is declared dead, and every
    remote actor answers afterwards from the same process, never restarted."""

    async def main() -> None:
        async with where(2) as hosts, otpmesh.start(_tree(2)) as app:
            await _lifelines_up(hosts)
            before = await _identities(app)
            registered = list(hosts.live)
            since = len(app.events)
            end = time.monotonic() + 3 * HOST_TIMEOUT
            if hold == "sleep":
                time.sleep(3 * HOST_TIMEOUT)
            else:
                while time.monotonic() < end:
                    sum(range(1000))
            await trio.sleep(2 * HOST_TIMEOUT)  # room for a verdict, had there been one
            assert [h.dead_reason for h in registered] == [None, None]
            assert hosts.live == registered
            assert await _identities(app) == before
            assert (await app.mesh("root/workers").echo(7)).values() == [7] * 4
            exits = [e for e in list(app.events)[since:] if e.kind == LogKind.CHILD_EXITED]
            assert exits == [] and _restarts(app, since) == 0

    with caplog.at_level(logging.WARNING, logger="otpmesh"):
        run_trio(main, timeout=90)
    assert "fencing" not in caplog.text and "declared dead" not in caplog.text
    # What a held loop still costs is named, with the remedy.
    assert "calls, replies and restarts waited for it" in caplog.text


def test_a_loop_held_past_the_limit_is_taken_for_hung_and_its_hosts_fence(
    where: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Lifelines cover a busy loop, not a hung one: held past ``LOOP_HELD_LIMIT`` (here 1 x
    HOST_TIMEOUT; 60 s by default), the thread beats no more, the agents fence their workers as
    for a lost controller, and the actors are restarted once the loop turns again. Before, a
    controller whose driver deadlocked kept its remote workers (and a standby out) for ever."""
    from otpmesh._hosts import _cluster

    monkeypatch.setattr(_cluster, "LOOP_HELD_LIMIT", HOST_TIMEOUT)

    async def main() -> None:
        async with where(2) as hosts, otpmesh.start(_tree(2)) as app:
            await _lifelines_up(hosts)
            before = await _identities(app)
            since = len(app.events)
            time.sleep(6 * HOST_TIMEOUT)  # past the limit, and room for the agents to fence
            with trio.fail_after(60):  # a hang guard: the remote actors come back elsewhere
                while _restarts(app, since) < 4:
                    await trio.sleep(0.05)
            assert not any(alive(pid) for pid, _ in before)  # fenced by their agents
            assert (await app.mesh("root/workers").echo(7)).values() == [7] * 4

    with caplog.at_level(logging.WARNING, logger="otpmesh"):
        run_trio(main, timeout=120)
    assert "lifelines beat no more" in caplog.text


def test_a_cut_host_is_fenced_and_replaced_though_its_lifeline_was_up(where: Any) -> None:
    """The lifeline does not weaken fencing: a host cut off (its link down, or its agent
    SIGSTOPped on localhost) is declared dead, its agent kills its workers, and its actors
    restart on the spare."""
    spaces = where.spaces

    async def main() -> None:
        async with where(3) as hosts, otpmesh.start(_tree(2)) as app:
            await _lifelines_up(hosts)
            old = hosts.live[1]
            before = await _identities(app)
            since = len(app.events)
            if spaces is not None:
                spaces.cut(1)
            else:
                import os
                import signal

                launcher = hosts.launcher
                assert isinstance(launcher, otpmesh.launchers.Local)
                os.kill(launcher.processes[1].pid, signal.SIGSTOP)
            with trio.fail_after(30):
                while old.alive:
                    await trio.sleep(0.02)
            assert "stopped answering" in str(old.dead_reason)
            with trio.fail_after(30):
                while _restarts(app, since) < 2:
                    await trio.sleep(0.05)
            with trio.fail_after(30):  # fenced by its own agent: no actor runs twice
                while alive(before[2][0]) or alive(before[3][0]):
                    await trio.sleep(0.05)
            after = await _identities(app)
            assert after[2][1] == after[3][1] == "local2"
            if spaces is not None:
                spaces.reconnect(1)

    run_trio(main, timeout=90)


def test_a_lifeline_for_an_unknown_host_or_with_a_wrong_token_is_refused(
    where: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone on the network can reach the cluster listener: a lifeline HELLO must name a live
    host AND carry its one-time token, or its connection is closed and no host is touched."""

    async def main() -> None:
        async with where(1) as hosts:
            await _lifelines_up(hosts)
            host = hosts.live[0]
            tries = [
                {"lifeline": "no-such-host", "token": b"x" * 16},
                {"lifeline": host.host_id, "token": b"x" * 16},
                {"lifeline": host.host_id},
            ]
            for hello in tries:
                sock, mac = await dial(hosts.address, b"test-cluster-secret")
                assert mac is not None
                frame = _codec.pack([HELLO, hello])
                tag = mac.seal((frame,))
                sock.sendall(frame_header(len(frame) + len(tag)) + frame + tag)
                await trio.lowlevel.wait_readable(sock)
                assert sock.recv(4096) == b""  # closed, nothing said
                sock.close()
            await trio.sleep(3 * HOST_TIMEOUT)
            assert host.alive and hosts.live == [host]

    with caplog.at_level(logging.WARNING, logger="otpmesh"):
        run_trio(main, timeout=60)
    assert caplog.text.count("lifeline HELLO") >= 1


def _framed(payload: bytes, mac: FrameMac) -> bytes:
    tag = mac.seal((payload,))
    return frame_header(len(payload) + len(tag)) + payload + tag


def _read_frame(sock: socket.socket, mac: FrameMac | None) -> Any:
    sock.settimeout(30)  # a hang guard
    decoder = FrameDecoder()
    while True:
        frames = decoder.feed(sock.recv(4096))
        if frames:
            return _codec.unpack(frames[0] if mac is None else mac.open(frames[0]))


def test_the_lifelines_thread_beats_records_beats_and_closes_on_anything_else() -> None:
    """The thread alone, on a real socket pair: it beats (MACed), records the peer's beats, and
    a frame that is not a beat closes that lifeline (never the thread: a second one goes on)."""
    keys = (b"k" * 32, b"j" * 32)
    lifelines = Lifelines(0.01)
    lifelines.start()
    try:
        lines, peers = [], []
        for name in ("good", "bad"):
            ours, theirs = socket.socketpair()
            lines.append(Lifeline(ours, FrameMac(*keys), name))
            peers.append((theirs, FrameMac(keys[1], keys[0])))
            lifelines.add(lines[-1])
        for sock, mac in peers:
            assert is_beat(_read_frame(sock, mac))
        (good_sock, good_mac), (bad_sock, bad_mac) = peers
        seen = lines[0].last_seen
        good_sock.sendall(_framed(BEAT, good_mac))
        deadline = time.monotonic() + 30  # a hang guard
        while lines[0].last_seen == seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lines[0].last_seen > seen
        bad_sock.sendall(_framed(_codec.pack([HELLO, {"spawn": "me"}]), bad_mac))
        while lines[1].close_reason is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lines[1].close_reason == "a lifeline carries beats only"
        assert lines[0].close_reason is None and is_beat(_read_frame(good_sock, good_mac))
    finally:
        lifelines.stop()
    assert lines[0].close_reason == "the cluster stopped"


def test_the_lifelines_thread_stops_beating_while_the_loop_is_held_past_its_limit() -> None:
    """The thread beats while the loop ticks; once the loop has not ticked for ``held_limit``
    it sends nothing more, and it beats again at the next tick."""
    lifelines = Lifelines(0.01, held_limit=0.3)
    lifelines.start()
    ours, theirs = socket.socketpair()
    try:
        lifelines.add(Lifeline(ours, None, "host"))
        assert is_beat(_read_frame_ticking(theirs, lifelines))
        deadline = time.monotonic() + 30  # a hang guard
        while not lifelines._warned and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lifelines._warned  # held: every beat it sent is in the socket by now
        theirs.setblocking(False)
        try:
            while theirs.recv(4096):
                pass
        except BlockingIOError:
            pass
        theirs.setblocking(True)
        readable, _, _ = select.select([theirs], [], [], 0.3)
        assert not readable, "a beat while the loop was held past the limit"
        assert is_beat(_read_frame_ticking(theirs, lifelines))
    finally:
        lifelines.stop()
        theirs.close()


def _read_frame_ticking(sock: socket.socket, lifelines: Lifelines) -> Any:
    """The next frame on `sock`, ticking `lifelines` as a turning loop does until it comes: a
    thread the load keeps from running for longer than its limit still beats at last."""
    decoder = FrameDecoder()
    deadline = time.monotonic() + 30  # a hang guard
    while time.monotonic() < deadline:
        lifelines.tick()
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            frames = decoder.feed(sock.recv(4096))
            if frames:
                return _codec.unpack(frames[0])
    raise AssertionError("no beat within 30 s of ticking")
