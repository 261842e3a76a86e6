"""Whom ``otpmesh watch``'s listener serves (``otpmesh/_controller/_watchers.py``): a flood of
connections that prove nothing, from one process or several of the app's own user, leaves a
watcher attaching and reading the app's state; one process is served a bounded number of
watchers; the accept loop waits out EMFILE and then serves again (issue 39, item 6).

The app runs in this process (``placement="local"``), so the tests read the listener's counts;
the floods are real processes, the watcher is the command's own ``Attached``. Counts, not
timings."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import otpmesh
from otpmesh import Supervisor, Worker
from otpmesh._cli._cli_watch import Attached, watchable_apps
from otpmesh._controller._watch import socket_path, watched_apps
from otpmesh._controller._watchers import (
    MAX_WATCHERS,
    UNPROVEN,
    UNPROVEN_PER_PROCESS,
    WATCHERS_PER_PROCESS,
    Watchers,
)
from otpmesh._wire._secret import NONCE_SIZE
from tests.actors import Echo
from tests.conftest import no_descriptor_left, run_trio

TREE = Supervisor("w", children=[Worker("a", Echo)])

#: PROCS processes (this one and its forks), each holding PER connections to the Unix socket at
#: PATH that never send a byte, each opened again as soon as the listener closes it; a byte on
#: stdout for each one opened. They end with their parent (the test's kill, or its end).
SILENT_FLOOD = r"""
import os, select, socket, sys
path, procs, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(procs - 1):
    if os.fork() == 0:
        break
parent = os.getppid()
held = set()
while os.getppid() == parent:
    while len(held) < per:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(0.5)
        try:
            s.connect(path)
        except OSError:
            s.close()
            break
        held.add(s)
        os.write(1, b".")
    ready, _, _ = select.select(list(held), [], [], 0.2)
    for s in ready:
        try:
            data = s.recv(4096)  # the listener's nonce, never answered; or its close
        except OSError:
            data = b""
        if not data:
            held.discard(s)
            s.close()
"""


class SilentFlood:
    """SILENT_FLOOD against `path`, in a process group of its own; ``opened()`` counts."""

    def __init__(self, path: Path, procs: int, per: int, counter: Path) -> None:
        self.counter = counter
        with counter.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", SILENT_FLOOD, str(path), str(procs), str(per)],
                stdout=out,
                start_new_session=True,
            )

    def opened(self) -> int:
        return self.counter.stat().st_size

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


@pytest.fixture(autouse=True)
def private_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Apps are found in a runtime directory of the test's own (not another xdist worker's)."""
    runtime_dir = tmp_path / "run"
    runtime_dir.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    yield


async def _listening() -> tuple[Watchers, Path]:
    """This process's watch listener, once it listens, and its socket's path."""
    watched = watched_apps()
    with trio.fail_after(20):
        while watched.watchers is None:
            await trio.sleep(0.01)
    return watched.watchers, socket_path(watchable_apps()[os.getpid()], os.getpid())


async def _attach() -> Attached:
    """A watcher of this process's app, as ``otpmesh watch`` attaches, its watch asked for."""
    attached = await Attached.connect(os.getpid())
    await attached.stream.send_all(b'{"op": "watch", "app": null}\n')
    return attached


async def _state(attached: Attached) -> list[dict[str, Any]]:
    """What a watcher is sent first: the outline, the log so far, up to "live"."""
    messages = [await attached.lines.next()]
    while messages[-1]["t"] not in ("live", "error"):
        messages.append(await attached.lines.next())
    return messages


async def _watch_once() -> list[str]:
    """Attach, read the app's state, leave: the paths of the tree the watcher was shown."""
    attached = await _attach()
    async with attached.stream:
        state = await _state(attached)
    assert state[0]["t"] == "tree", state
    assert state[-1] == {"t": "live"}
    return [row[0] for row in state[0]["outline"]]


@pytest.mark.timeout(90)  # 4 flooding processes take the whole machine (under xdist)
@pytest.mark.parametrize("procs", [1, pytest.param(4, marks=pytest.mark.whole_machine)])
def test_a_same_user_flood_that_never_sends_a_byte_leaves_a_watcher_attaching(
    procs: int, tmp_path: Path
) -> None:
    per = 30

    async def body() -> None:
        async with otpmesh.start(TREE, placement="local"):
            watchers, path = await _listening()
            flood = SilentFlood(path, procs, per, tmp_path / "opened")
            try:
                with trio.fail_after(30):  # all of its connections, and again once closed
                    while flood.opened() < 4 * per * procs:
                        await trio.sleep(0.02)
                for _ in range(5):  # a watcher attaches (each time) and reads the app's state
                    assert await _watch_once() == ["w", "w/a"]
                opened = flood.opened()
                with trio.fail_after(30):  # the flood went on all along
                    while flood.opened() < opened + per * procs:
                        await trio.sleep(0.02)
                # It held its share, evicted and taken back: at most 2 places per process.
                assert len(watchers.unproven) <= min(UNPROVEN, procs * UNPROVEN_PER_PROCESS)
                assert watchers.unproven.evicted >= 2 * per * procs
            finally:
                flood.stop()  # at once, even when cancelled: a kill and a reap
            assert await _watch_once() == ["w", "w/a"]

    run_trio(body, timeout=80)


@pytest.mark.timeout(60)
def test_one_process_is_served_a_bounded_number_of_watchers_the_next_is_told_why() -> None:
    async def body() -> None:
        async with otpmesh.start(TREE, placement="local"):
            watchers, _ = await _listening()
            served = [await _attach() for _ in range(WATCHERS_PER_PROCESS)]
            for attached in served:
                assert (await _state(attached))[-1] == {"t": "live"}
            refused = await _attach()
            async with refused.stream:
                (error,) = await _state(refused)
            assert error == {
                "t": "error",
                "error": (
                    f"process {os.getpid()} watches this app {WATCHERS_PER_PROCESS} times "
                    f"already (at most {MAX_WATCHERS}, {WATCHERS_PER_PROCESS} per process): "
                    "stop one, then try again"
                ),
            }
            assert watchers.watching == {os.getpid(): WATCHERS_PER_PROCESS}
            assert (await served[0].lines.next())["t"] == "now"  # those served still are
            await served[0].stream.aclose()  # one leaves: its place is free again
            with trio.fail_after(20):
                while watchers.watching[os.getpid()] == WATCHERS_PER_PROCESS:
                    await trio.sleep(0.01)
            assert await _watch_once() == ["w", "w/a"]
            await served[1].stream.aclose()

    run_trio(body)


@pytest.mark.timeout(60)
def test_the_watch_accept_loop_waits_out_emfile_and_serves_watchers_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        async with otpmesh.start(TREE, placement="local"):
            watchers, path = await _listening()
            watched = watched_apps()
            for episode in (1, 2):
                # The last episode's connections closed first: one closed inside the block
                # would free a descriptor, let one accept through and start a second episode.
                with trio.fail_after(20):
                    while watchers.watching or len(watchers.unproven):
                        await trio.sleep(0.01)
                clients = [trio.socket.socket(socket.AF_UNIX) for _ in range(UNPROVEN_PER_PROCESS)]
                failed = watchers.acceptor.failures
                with no_descriptor_left():
                    for client in clients:
                        await client.connect(str(path))  # queued: the accept fails (EMFILE)
                    with trio.fail_after(20):  # until it tried again after a pause, or gave up
                        while watchers.acceptor.failures < failed + 2 and watched.watchers:
                            await trio.sleep(0.01)
                for client in clients:  # each is accepted once descriptors came back
                    with client:
                        with trio.fail_after(20):
                            assert len(await client.recv(NONCE_SIZE)) == NONCE_SIZE
                assert await _watch_once() == ["w", "w/a"]
                assert watchers.acceptor.episodes == episode

    with caplog.at_level(logging.INFO, logger="otpmesh"):
        run_trio(body)
    lines = [r.getMessage() for r in caplog.records if "otpmesh watch of pid" in r.getMessage()]
    assert sum("cannot accept connections now" in line for line in lines) == 2
    assert sum("accepts connections again" in line for line in lines) == 2
