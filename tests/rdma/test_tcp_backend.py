"""The tcp backend on its own (owner and reader in one process, over loopback): transfers in
one or several streams, connections kept for later transfers, and an owner that anyone on the
network may send anything without it stopping to serve or moving bytes it should not."""

from __future__ import annotations

import ctypes
import os
import socket
from typing import Any

import msgpack
import pytest
import trio

from otpmesh.rdma import _tcp, _tcpwire
from otpmesh.rdma._backend import Caller, Peer, Region
from otpmesh.rdma._tcp import TcpBackend
from otpmesh.rdma._tcpidle import IdleConnections
from tests.conftest import no_descriptor_left, run_trio

PATTERN = bytes(range(256)) * 64  # 16 KiB


def _region(data: bytearray) -> Region:
    return Region(ctypes.addressof(ctypes.c_char.from_buffer(data)), len(data))


def _raw_request(address: tuple[str, int], body: bytes) -> bytes:
    """What the owner at `address` answers to `body` sent as a request on a connection of its
    own, before it closes the connection (a reset, when it left part of `body` unread)."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(_tcpwire.LEN.pack(len(body)) + body)
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionResetError:
            pass
        return answer


def peer(owner: TcpBackend) -> Peer:
    """`owner` as its readers see it: its backend's requests run its ``serve`` (in a node they
    travel on the control connection, for token holders only)."""

    async def request(backend: str, op: str, payload: Any) -> Any:
        # Only "listen" is asked here, which does not look at who asks.
        caller = Caller(pid=None, region=Region(0, 0), writable=False, pinned=False)
        return await owner.serve(op, payload, caller)

    return Peer(os.getpid(), "", "", request)


def _served(writable: bool) -> tuple[TcpBackend, TcpBackend, bytearray, dict[str, Any]]:
    """An owner serving PATTERN as buffer 1, a reader, the buffer's bytes and its entry."""
    owner, reader = TcpBackend(), TcpBackend()
    data = bytearray(PATTERN)
    return owner, reader, data, owner.register(1, _region(data), writable=writable)


async def _read(owner: TcpBackend, reader: TcpBackend, entry: dict[str, Any]) -> bytearray:
    incoming = bytearray(len(PATTERN))
    await reader.read(entry, peer(owner), _region(incoming), 0)
    return incoming


def test_a_large_read_and_write_move_every_byte_in_several_streams(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_tcp, "PARALLEL_ABOVE", 4096)
    assert len(_tcp._slices(len(PATTERN))) == _tcp.STREAMS

    async def body() -> None:
        owner, reader, data, entry = _served(writable=True)
        incoming = await _read(owner, reader, entry)
        assert incoming == PATTERN
        outgoing = bytearray(reversed(PATTERN))
        await reader.write(entry, peer(owner), _region(outgoing), 0)
        assert data == outgoing

    run_trio(body, timeout=30)


def test_a_reused_connection_needs_each_buffers_own_token() -> None:
    async def body() -> None:
        owner, reader = TcpBackend(), TcpBackend()
        mine, theirs = bytearray(PATTERN), bytearray(b"secret" * 100)
        entry = owner.register(1, _region(mine), writable=True)
        owner.register(2, _region(theirs), writable=True)
        incoming = bytearray(len(PATTERN))
        await reader.read(entry, peer(owner), _region(incoming), 0)
        address = owner.listen()
        kept = reader._idle.take(address)
        assert kept is not None  # the connection stayed open: it carries the next request
        reader._idle.give(address, kept)
        await reader.read(entry, peer(owner), _region(incoming), 0)
        forged = {**entry, "buffer": 2}  # my token, their buffer, on the kept connection
        small = bytearray(16)
        with pytest.raises(ConnectionError, match="buffer not registered"):
            await reader.read(forged, peer(owner), _region(small), 0)
        assert small == bytearray(16)

    run_trio(body, timeout=30)


def test_a_reader_opens_a_new_connection_when_the_owner_closed_an_idle_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_tcp, "IDLE", 0.05)

    async def body() -> None:
        owner, reader, _data, entry = _served(writable=True)
        incoming = await _read(owner, reader, entry)
        address = owner.listen()
        kept = reader._idle.take(address)
        assert kept is not None
        await trio.lowlevel.wait_readable(kept)  # the owner closed it: end of stream
        assert kept.recv(1, socket.MSG_PEEK) == b""
        reader._idle.give(address, kept)
        incoming[:] = bytes(len(incoming))
        await reader.read(entry, peer(owner), _region(incoming), 0)
        assert incoming == PATTERN
        assert kept.fileno() == -1  # dropped, and the read went on a new connection

    run_trio(body, timeout=30)


def test_a_reader_closes_connections_idle_for_a_whole_period_and_all_at_the_end() -> None:
    idle = IdleConnections(_tcp.IDLE, _tcp.STREAMS)
    idle.held = True  # as a trio run that kept one would have it
    pairs = [socket.socketpair() for _ in range(3)]
    idle.give(("a", 1), pairs[0][0])
    idle._sweep(everything=False)
    idle.give(("b", 2), pairs[1][0])
    assert idle.count() == 2
    idle._sweep(everything=False)  # the first has now sat through a whole period
    assert pairs[0][0].fileno() == -1 and pairs[1][0].fileno() != -1
    assert idle.count() == 1
    idle.give(("b", 2), pairs[2][0])
    idle._sweep(everything=True)  # the run ends
    assert idle.count() == 0 and not idle.held
    assert all(mine.fileno() == -1 for mine, _ in pairs[1:])
    idle.give(("c", 3), pairs[2][1])  # kept by nobody now: closed at once
    assert idle.count() == 0 and pairs[2][1].fileno() == -1
    for _, theirs in pairs[:2]:
        theirs.close()


def test_connections_a_run_kept_are_closed_when_it_ends() -> None:
    reader = TcpBackend()

    async def body() -> socket.socket:
        owner = TcpBackend()
        data = bytearray(PATTERN)
        entry = owner.register(1, _region(data), writable=False)
        await _read(owner, reader, entry)
        kept = reader._idle.take(owner.listen())
        assert kept is not None
        reader._idle.give(owner.listen(), kept)
        return kept

    kept = run_trio(body, timeout=30)
    assert kept.fileno() == -1 and reader._idle.count() == 0 and not reader._idle.held


@pytest.mark.parametrize(
    "request_body",
    [
        msgpack.packb([]),
        msgpack.packb({"buffer": [1]}),
        b"\xc1",
        msgpack.packb({"buffer": 1, "token": b"x", "op": "read", "offset": 0, "nbytes": 4}),
        msgpack.packb({"buffer": 1, "token": "x", "op": "read", "offset": -8, "nbytes": 4}),
        msgpack.packb({"buffer": 1, "token": "x", "op": "read", "offset": 0.5, "nbytes": 4}),
        msgpack.packb({"buffer": 1, "token": "x", "op": "exec", "offset": 0, "nbytes": 4}),
    ],
    ids=["list", "unhashable", "garbage", "bytes-token", "negative", "float", "unknown-op"],
)
def test_a_malformed_request_is_dropped_and_the_owner_keeps_serving(request_body: bytes) -> None:
    async def body() -> None:
        owner, reader, _data, entry = _served(writable=False)
        assert await trio.to_thread.run_sync(_raw_request, owner.listen(), request_body) == b""
        incoming = await _read(owner, reader, entry)
        assert incoming == PATTERN

    run_trio(body, timeout=30)


def test_the_owner_refuses_a_transfer_past_the_end_and_an_oversized_request() -> None:
    async def body() -> None:
        owner, reader, data, entry = _served(writable=True)
        incoming = bytearray(len(data))
        with pytest.raises(ConnectionError, match="runs past the end of the buffer"):
            await reader.read(entry, peer(owner), _region(incoming), 1)
        huge = b"\x80" * (_tcpwire.REQUEST_MAX + 1)
        assert await trio.to_thread.run_sync(_raw_request, owner.listen(), huge) == b""

    run_trio(body, timeout=30)


def test_the_owner_closes_the_longest_waiting_connection_when_too_many_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_tcp, "_MAX_IDLE", 1)

    async def body() -> None:
        owner, first, second = TcpBackend(), TcpBackend(), TcpBackend()
        data = bytearray(PATTERN)
        entry = owner.register(1, _region(data), writable=False)
        address = owner.listen()
        incoming = bytearray(len(data))
        await first.read(entry, peer(owner), _region(incoming), 0)
        await second.read(entry, peer(owner), _region(incoming), 0)
        kept = first._idle.take(address)
        assert kept is not None
        with trio.fail_after(10):
            await trio.lowlevel.wait_readable(kept)  # the owner closed the first one
        assert kept.recv(1, socket.MSG_PEEK) == b""
        kept.close()
        other = second._idle.take(address)
        assert other is not None
        second._idle.give(address, other)  # still open: it is the one waiting now
        await second.read(entry, peer(owner), _region(incoming), 0)
        assert other.fileno() != -1 and incoming == PATTERN

    run_trio(body, timeout=30)


def test_a_request_that_never_completes_is_dropped_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_tcp, "TIMEOUT", 0.2)

    async def body() -> None:
        owner = TcpBackend()
        data = bytearray(PATTERN)
        owner.register(1, _region(data), writable=False)
        stalled = trio.socket.socket()
        await stalled.connect(owner.listen())
        await stalled.send(_tcpwire.LEN.pack(50) + b"\x85")  # 1 byte of a 50-byte request
        with trio.fail_after(20):
            assert await stalled.recv(100) == b""  # closed by the owner, nothing answered
        stalled.close()

    run_trio(body, timeout=30)


def test_the_owner_keeps_accepting_after_the_process_ran_out_of_descriptors(
    caplog: pytest.LogCaptureFixture,
) -> None:

    async def body() -> None:
        owner, reader, data, entry = _served(writable=False)
        address = owner.listen()
        clients = [socket.socket() for _ in range(4)]
        with no_descriptor_left():
            for client in clients:
                client.connect(address)  # queued: the owner's accept fails (EMFILE)
            with trio.fail_after(20):
                while owner.acceptor is None or owner.acceptor.failures < 3:
                    await trio.sleep(0.01)
        for client in clients:
            client.close()
        incoming = bytearray(len(data))
        with trio.fail_after(20):
            await reader.read(entry, peer(owner), _region(incoming), 0)
        assert incoming == PATTERN

    run_trio(body, timeout=30)
    # It did run out, failed again and again, and said so once.
    assert caplog.text.count("cannot accept connections now") == 1
