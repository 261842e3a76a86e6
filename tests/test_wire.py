"""The wire protocol: framing, handshake, and garbage that must only ever close one connection."""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

import msgpack
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import otpmesh
from otpmesh._runtime._controller_runtime import runtime
from otpmesh._wire import _secret
from otpmesh._wire._codec import pack
from otpmesh._wire._connection import Connection
from otpmesh._wire._frames import decode_message
from otpmesh._wire._framing import MAX_FRAME_SIZE, FrameDecoder, frame_header
from otpmesh._wire._handshake import HANDSHAKE, check_handshake
from tests.actors import Echo
from tests.conftest import run_trio


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def test_decoder_splits_frames_across_arbitrary_chunk_boundaries() -> None:
    data = b"".join(_frame(pack([1, "a", "m", [i], {}])) for i in range(50))
    for step in (1, 3, 7, 64, len(data)):
        decoder = FrameDecoder()
        frames = []
        for i in range(0, len(data), step):
            frames += decoder.feed(data[i : i + step])
        assert [decode_message(f)[3] for f in frames] == [[i] for i in range(50)]
        assert decoder.buffered == 0


def test_oversized_frame_is_refused_before_it_is_buffered() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    with pytest.raises(otpmesh.ProtocolError, match="frame of 1025 bytes exceeds the limit"):
        decoder.feed(struct.pack(">I", 1025))
    with pytest.raises(otpmesh.ProtocolError, match="exceeds the limit"):
        frame_header(MAX_FRAME_SIZE + 1)


def test_handshake_checks_magic_and_version() -> None:
    check_handshake(HANDSHAKE)
    with pytest.raises(otpmesh.ProtocolError, match="bad handshake magic"):
        check_handshake(b"HTTP/1.1" + HANDSHAKE[8:])
    with pytest.raises(otpmesh.ProtocolError, match="protocol version 99"):
        check_handshake(HANDSHAKE[:8] + struct.pack(">HH", 99, 0))


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"\xc1", "malformed frame"),
        (msgpack.packb({"not": "a list"}), "not a message array"),
        (msgpack.packb([42, 1]), "unknown frame kind 42"),
        (msgpack.packb([0, 1, 2]), "needs 6 fields, got 3"),
        (msgpack.packb([2, 1, msgpack.ExtType(77, b"")]), "unknown extension type 77"),
        (msgpack.packb([2, 1, msgpack.ExtType(1, b"\x00")]), "malformed frame"),
    ],
)
def test_bad_frames_are_protocol_errors(payload: bytes, match: str) -> None:
    with pytest.raises(otpmesh.ProtocolError, match=match):
        decode_message(payload)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_garbage_bytes_only_ever_raise_protocol_errors(chunks: list[bytes]) -> None:
    decoder = FrameDecoder(max_frame_size=1 << 16)
    try:
        for chunk in chunks:
            for frame in decoder.feed(chunk):
                decode_message(frame)
    except otpmesh.ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_inside_a_well_framed_payload_only_raises_protocol_errors(payload: bytes) -> None:
    try:
        decode_message(payload)
    except otpmesh.ProtocolError:
        pass


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def _raw_connect(addr: str, secret: bytes | None = None) -> socket.socket:
    """A raw Unix connection to a node; with `secret`, past the handshake and the proof (a
    peer that belongs to the app: what a compromised worker could send)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(addr)
    if secret is not None:
        sock.sendall(HANDSHAKE)
        assert _recv_exactly(sock, len(HANDSHAKE)) == HANDSHAKE
        nonce_a = _recv_exactly(sock, _secret.NONCE_SIZE)
        nonce_d = _secret.new_nonce()
        sock.sendall(nonce_d + _secret.dialer_proof(secret, nonce_a, nonce_d))
        expected = _secret.acceptor_proof(secret, nonce_a, nonce_d)
        assert _recv_exactly(sock, _secret.PROOF_SIZE) == expected
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    "attack",
    [
        "bad-handshake",
        "oversized",
        "truncated",
        "unknown-kind",
        "not-msgpack",
        "random",
        "sys-call-id-not-an-int",
        "call-id-unhashable",
    ],
)
def test_a_bad_connection_is_closed_and_the_worker_keeps_serving(attack: str) -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            mesh = await procs.spawn("w", Echo)
            addr = procs._procs[0].addr
            secret = (await runtime()).node.secret
            bystander = _raw_connect(addr, secret)

            def attack_worker() -> bool:
                sock = _raw_connect(addr, None if attack == "bad-handshake" else secret)
                if attack == "bad-handshake":
                    sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
                elif attack == "oversized":
                    sock.sendall(struct.pack(">I", MAX_FRAME_SIZE + 1))
                elif attack == "truncated":
                    sock.sendall(struct.pack(">I", 100) + b"abc")
                    sock.shutdown(socket.SHUT_WR)
                elif attack == "unknown-kind":
                    sock.sendall(_frame(msgpack.packb([99, 1])))
                elif attack == "not-msgpack":
                    sock.sendall(_frame(b"\xc1\xc1\xc1"))
                elif attack == "sys-call-id-not-an-int":  # once crashed the whole worker
                    sock.sendall(_frame(msgpack.packb([4, "x", "ping", None])))
                elif attack == "call-id-unhashable":  # likewise, in the actor's cell
                    sock.sendall(_frame(msgpack.packb([0, [1], "w/0", "echo", [1], {}])))
                else:  # a plausible length prefix, then the sender gives up mid-frame
                    sock.sendall(bytes(range(256)) * 4)
                    sock.shutdown(socket.SHUT_WR)
                closed = _closed_by_peer(sock)
                sock.close()
                return closed

            assert await trio.to_thread.run_sync(attack_worker)
            # The process, its controller connection and other connections still work.
            assert await mesh[0].echo("still here") == "still here"
            bystander.sendall(_frame(pack([0, 7, "w/0", "echo", ["bystander"], {}])))
            reply = await trio.to_thread.run_sync(bystander.recv, 4096)
            assert msgpack.unpackb(reply[4:]) == [2, 7, "bystander"]
            bystander.close()

    run_trio(body)


def test_a_frame_sent_while_the_writer_waits_for_the_socket_queues_behind_it() -> None:
    """The writer task sends a large frame and waits for the socket part-way: a small frame
    sent meanwhile must follow it, not be written straight into the middle of its bytes."""
    big, small = b"x" * (4 << 20), b"small"

    async def body() -> list[bytes]:
        left, right = socket.socketpair()
        left.setblocking(False)
        right.setblocking(False)
        conn = Connection(left, peer="test", decode=lambda f: (f, ()), on_message=print)
        received = bytearray()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            conn.send_nowait(big)
            while conn._out:  # until the writer has taken it (and waits for the socket)
                await trio.sleep(0)
            await trio.lowlevel.wait_readable(right)
            received += right.recv(1 << 16)  # room in the socket, before the writer runs again
            conn.send_nowait(small)
            while len(received) < len(big) + len(small) + 8:
                await trio.lowlevel.wait_readable(right)
                received += right.recv(1 << 20)
            nursery.cancel_scope.cancel()
        right.close()
        return FrameDecoder().feed(received)

    assert run_trio(body, timeout=30) == [big, small]


class _CountingSocket(socket.socket):
    """A real socket that counts the writes made on it."""

    writes = 0

    def send(self, data: Any, flags: int = 0) -> int:
        self.writes += 1
        return super().send(data, flags)


def test_a_burst_of_small_frames_queued_past_the_coalescing_limit_goes_out_in_few_writes() -> None:
    """10,000 small frames sent in one pass (a pipelined burst of calls, or their replies):
    the first is written at once, the rest queue for the writer, well past the size it joins
    in one write. It must still join them into writes of about that size, not write each part
    of each frame on its own (it once made six writes per frame)."""
    frames = [b"frame %05d" % i for i in range(10_000)]
    padding = [b"p" * 40] * len(frames)  # a second part per frame, as calls have several

    async def body() -> tuple[int, list[bytes]]:
        a, right = socket.socketpair()
        left = _CountingSocket(fileno=a.detach())
        left.setblocking(False)
        right.setblocking(False)
        conn = Connection(left, peer="test", decode=lambda f: (f, ()), on_message=print)
        received = bytearray()
        size = sum(len(f) + len(p) + 4 for f, p in zip(frames, padding, strict=True))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            for frame, pad in zip(frames, padding, strict=True):
                conn.send_nowait(frame, pad)
            while len(received) < size:
                await trio.lowlevel.wait_readable(right)
                received += right.recv(1 << 20)
            nursery.cancel_scope.cancel()
        right.close()
        return left.writes, FrameDecoder().feed(received)

    writes, received = run_trio(body, timeout=30)
    assert received == [f + p for f, p in zip(frames, padding, strict=True)]
    assert writes < 50, f"{writes} writes for {len(frames)} frames"


class _CountingReads(socket.socket):
    """A real socket that counts the reads made on it."""

    reads = 0

    def recvmsg(self, *args: Any) -> Any:
        self.reads += 1
        return super().recvmsg(*args)


def _counting_pair() -> tuple[_CountingReads, socket.socket]:
    a, right = socket.socketpair()
    left = _CountingReads(fileno=a.detach())
    left.setblocking(False)
    right.setblocking(False)
    return left, right


def test_a_reader_that_emptied_the_socket_waits_for_it_rather_than_reading_again() -> None:
    """100 frames, each sent once the one before was handled (a unicast caller's replies, a
    worker's calls): one read each. Before, every read that emptied the socket was followed by
    another that failed (EAGAIN): two system calls per frame."""

    async def body() -> tuple[int, list[bytes]]:
        left, right = _counting_pair()
        got: list[bytes] = []
        handled = trio.Event()

        def on_message(conn: Connection, message: Any, pending: Any) -> None:
            got.append(message)
            handled.set()

        conn = Connection(left, peer="test", decode=lambda f: (f, ()), on_message=on_message)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            for i in range(100):
                handled = trio.Event()
                right.send(_frame(b"frame %03d" % i))
                await handled.wait()
            nursery.cancel_scope.cancel()
        right.close()
        return left.reads, got

    reads, got = run_trio(body, timeout=30)
    assert got == [b"frame %03d" % i for i in range(100)]
    assert reads <= 101, f"{reads} reads for 100 frames"


def test_a_read_cut_short_by_a_passed_descriptor_leaves_nothing_unread() -> None:
    """A Unix socket's read stops after the bytes that carry descriptors, so a read can take
    less than is there: the reader, which then waits for the socket instead of reading again,
    must still get the rest (the socket is readable at once)."""

    async def body() -> list[bytes]:
        left, right = _counting_pair()
        got: list[bytes] = []
        conn = Connection(
            left, peer="test", decode=lambda f: (f, ()), on_message=lambda c, m, p: got.append(m)
        )
        r, w = os.pipe()
        try:
            right.send(_frame(b"before"))
            socket.send_fds(right, [_frame(b"with a descriptor")], [r])
            right.send(_frame(b"after"))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.run)
                with trio.fail_after(10):
                    while len(got) < 3:
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
        finally:
            os.close(r)
            os.close(w)
            right.close()
        return got

    assert run_trio(body, timeout=30) == [b"before", b"with a descriptor", b"after"]


def test_a_thousand_workers_dialing_at_once_wait_in_the_backlog_not_refused() -> None:
    """A node's Unix listener holds 1,000 connections nobody accepted yet: each connect waits
    its turn (past a backlog of 128, a non-blocking Unix connect failed with EAGAIN)."""
    from otpmesh._wire._addresses import bind

    listener = bind("w", None)
    dialers = []
    try:
        for _ in range(1000):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            dialers.append(sock)
            sock.connect(listener.getsockname())  # raises BlockingIOError when refused
    finally:
        for sock in dialers:
            sock.close()
        listener.close()


def test_a_dialer_waits_for_its_proof_as_long_as_it_is_told() -> None:
    """A listener that accepts nobody (a controller still working through a thousand dialers):
    the default dial gives up at 10 s, a worker's dial to its controller waits longer
    (MockClock)."""
    import trio.testing

    from otpmesh._wire._addresses import bind, listen_address
    from otpmesh._wire._handshake import dial

    async def main() -> None:
        listener = bind("w", None)
        address = listen_address(listener)
        try:
            with pytest.raises(trio.TooSlowError):
                await dial(address, b"s" * 32)
            with trio.move_on_after(30) as patient:
                await dial(address, b"s" * 32, timeout=60.0)
            assert patient.cancelled_caught  # still waiting at 30 s, not given up at 10
        finally:
            listener.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
