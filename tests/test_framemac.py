"""Frame MACs on TCP: a frame changed, replayed, reordered or injected on the way closes the
connection; an honest stream passes. The sans-IO rules, then a real TCP connection through a
proxy that tampers with it."""

from __future__ import annotations

import logging
import socket
from functools import partial
from typing import Any

import pytest
import trio

import otpmesh
from otpmesh._node._node import Node
from otpmesh._wire._framemac import TAG_SIZE, FrameMac, session_keys
from otpmesh._wire._handshake import FLAG_FRAME_MAC, handshake
from tests.conftest import run_trio

KEYS = session_keys(b"secret", b"a" * 32, b"d" * 32)


def _pair() -> tuple[FrameMac, FrameMac]:
    d2a, a2d = KEYS
    return FrameMac(d2a, a2d), FrameMac(a2d, d2a)  # the dialer's, the acceptor's


def test_honest_frames_pass_in_both_directions() -> None:
    dialer, acceptor = _pair()
    for i in range(5):
        payload = b"frame %d" % i
        assert acceptor.open(payload + dialer.seal((payload[:3], payload[3:]))) == payload
        assert dialer.open(payload + acceptor.seal((payload,))) == payload


@pytest.mark.parametrize("attack", ["changed", "replayed", "reordered", "reflected", "short"])
def test_a_tampered_stream_is_refused(attack: str) -> None:
    dialer, acceptor = _pair()
    frames = [payload + dialer.seal((payload,)) for payload in (b"first", b"second")]
    with pytest.raises(otpmesh.ProtocolError, match=r"integrity|too short"):
        if attack == "changed":
            acceptor.open(b"fIrst" + frames[0][5:])
        elif attack == "replayed":
            acceptor.open(frames[0])
            acceptor.open(frames[0])
        elif attack == "reordered":
            acceptor.open(frames[1])
        elif attack == "reflected":  # the dialer's own frame sent back to it
            dialer.open(frames[0])
        else:
            acceptor.open(b"x" * (TAG_SIZE - 1))


def test_each_connection_has_its_own_keys() -> None:
    assert session_keys(b"secret", b"a" * 32, b"d" * 32) != session_keys(
        b"secret", b"a" * 32, b"e" * 32
    )


async def _proxy(
    listener: trio.SocketListener, target: tuple[str, int], tamper: trio.Event
) -> None:
    """Forward one TCP connection to `target`; once `tamper` is set, flip a bit in the next
    chunk going to the target (after the handshake and the proofs)."""
    client = await listener.accept()
    server = await trio.open_tcp_stream(*target)

    async def pump(src: trio.SocketStream, dst: trio.SocketStream, meddle: bool) -> None:
        while data := await src.receive_some(65536):
            if meddle and tamper.is_set():
                # One bit of the payload, once (a changed length would only stall the
                # stream, as dropping packets would: no MAC can stop that).
                data = data[:10] + bytes([data[10] ^ 1]) + data[11:]
                meddle = False
            await dst.send_all(data)
        await dst.send_eof()

    async def both_ways() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, server, True)
            nursery.start_soon(pump, server, client, False)

    try:
        await both_ways()
    except trio.BrokenResourceError:
        pass
    finally:  # one side closed: close the other, as a real path would
        await client.aclose()
        await server.aclose()


def test_a_frame_changed_on_the_network_closes_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def echo(conn: Any, payload: Any) -> Any:
        return payload

    async def body() -> None:
        secret = b"cluster secret"
        acceptor = Node("a", sys_handlers={"echo": echo}, tcp_secret=secret)
        dialer = Node("d", tcp_secret=secret)
        tamper = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(acceptor.serve)
            await nursery.start(dialer.serve)
            addr = await acceptor.listen_tcp("127.0.0.1")
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            port = listeners[0].socket.getsockname()[1]
            target = ("127.0.0.1", int(addr.rsplit(":", 1)[1]))
            nursery.start_soon(_proxy, listeners[0], target, tamper)
            conn = await dialer.connect(f"tcp:127.0.0.1:{port}")
            assert await dialer.sys_call(conn, "echo", "honest", "a") == "honest"
            tamper.set()
            with pytest.raises(otpmesh.ActorDiedError, match="connection"):
                await dialer.sys_call(conn, "echo", "tampered", "a")
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.WARNING, logger="otpmesh"):  # the node's refusal log
        run_trio(body, timeout=30)
    assert any("failed its integrity check" in r.getMessage() for r in caplog.records)


def test_a_peer_with_macs_off_is_refused_with_the_setting_to_change() -> None:
    """The flag is part of the handshake: a mismatch is named before any frame."""

    async def mismatch() -> list[str]:
        left, right = socket.socketpair()
        left.setblocking(False)
        right.setblocking(False)
        refusals: list[str] = []

        async def side(sock: socket.socket, dialer: bool, flags: int) -> None:
            with pytest.raises(otpmesh.ProtocolError) as refused:
                await handshake(sock, dialer=dialer, flags=flags)
            refusals.append(str(refused.value))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(side, right, False, 0))
            nursery.start_soon(partial(side, left, True, FLAG_FRAME_MAC))
        left.close()
        right.close()
        return sorted(refusals)

    assert run_trio(mismatch, timeout=10) == [
        "the peer has frame MACs off, this side on: set OTPMESH_TCP_INTEGRITY the same on "
        "every host",
        "the peer has frame MACs on, this side off: set OTPMESH_TCP_INTEGRITY the same on "
        "every host",
    ]
