"""The ``tcp`` backend: the last resort (other hosts, nothing better), on connections of its own
(never the control mailbox), chunked.

The owner listens on loopback (``OTPMESH_RDMA_TCP_HOST`` to bind elsewhere) and serves each
request straight from / into the tensor's memory; the owner's answer to a pin carries a random
per-buffer token that every request must present. A request is read and checked in trio (all of
it within ``TIMEOUT``); only an accepted one gets a thread, for its bytes. A read-only buffer (a
tensor sent in a message) refuses writes.

A reader keeps its connections to an owner open for later transfers (a connection authorizes
nothing: each request on it presents its own buffer's token) and moves a transfer of
``PARALLEL_ABOVE`` bytes or more as ``STREAMS`` slices on as many connections at once: one stream
leaves a core idle (between two hosts on one 2-core machine, two streams moved 256 MiB 1.4x as
fast as one). The owner waits for a connection's next request without a thread, and closes it
after ``IDLE`` seconds without one (or sooner, the longest-waiting first, when more than
``_MAX_IDLE`` wait); a reader closes one it kept unused through a whole ``IDLE`` period. When the
process runs out of descriptors, the owner stops accepting for a moment, never for good.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import secrets
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack
import trio

from ._backend import Caller, Peer, Region

_LEN = struct.Struct(">I")
_CHUNK = 4 << 20
_OK, _FAIL = b"\x00", b"\x01"
_OPS = ("read", "write")
#: The longest request a reader of ours sends (its msgpack header), with room to spare.
_REQUEST_MAX = 1024
#: Seconds a peer may stall mid-request or mid-transfer before its connection is dropped.
TIMEOUT = 30.0
#: Seconds the owner keeps a connection open waiting for its next request.
IDLE = 60.0
#: Transfers this large or larger move as `STREAMS` slices at once.
PARALLEL_ABOVE = 16 << 20
STREAMS = 2
#: Idle connections a reader keeps per owner (more are closed when their transfer ends).
_KEEP = STREAMS
#: Connections an owner keeps waiting for a next request (the longest-waiting goes first).
_MAX_IDLE = 64
#: Why accept may fail for a while without anything being wrong with the listener, and how
#: long to wait before trying again.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_RETRY_ACCEPT = 0.1
#: What a write to a read-only buffer is told (the registry says the same at the pin).
READ_ONLY = (
    "buffer {} is read-only: it holds a value sent in a message (a snapshot other receivers "
    "read too); write to an RDMABuffer its owner registered instead"
)


def _view(region: Region, offset: int, nbytes: int) -> memoryview:
    raw = (ctypes.c_char * nbytes).from_address(region.address + offset)
    return memoryview(raw).cast("B")


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the connection closed mid-transfer")
        data += chunk
    return bytes(data)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    done = 0
    while done < len(view):
        got = sock.recv_into(view[done : done + _CHUNK])
        if not got:
            raise ConnectionError("the connection closed mid-transfer")
        done += got


async def _receive(sock: socket.socket, n: int) -> bytes:
    """`n` bytes from the non-blocking `sock`, waiting for them in trio (no thread)."""
    data = bytearray()
    while len(data) < n:
        await trio.lowlevel.wait_readable(sock)
        try:
            chunk = sock.recv(n - len(data))
        except BlockingIOError:
            continue
        if not chunk:
            raise ConnectionError("the connection closed mid-request")
        data += chunk
    return bytes(data)


def _send_view(sock: socket.socket, view: memoryview) -> None:
    for start in range(0, len(view), _CHUNK):
        sock.sendall(view[start : start + _CHUNK])


def _slices(nbytes: int) -> list[tuple[int, int]]:
    """(start, size) of each stream's part of a transfer of `nbytes`, page-aligned."""
    if nbytes < PARALLEL_ABOVE:
        return [(0, nbytes)]
    step = (nbytes // STREAMS + 4095) & ~4095
    return [(start, min(step, nbytes - start)) for start in range(0, nbytes, step)]


@dataclass(frozen=True, slots=True)
class _Request:
    """One transfer a reader asks for, as the owner received it (anyone may have sent it)."""

    buffer: int
    token: str
    op: str
    offset: int
    nbytes: int

    def pack(self) -> bytes:
        fields = {name: getattr(self, name) for name in self.__slots__}
        body: bytes = msgpack.packb(fields)
        return _LEN.pack(len(body)) + body

    @classmethod
    def parse(cls, body: bytes) -> _Request:
        """ValueError unless `body` is a request of ours, with in-range numbers."""
        req = msgpack.unpackb(body)
        if not isinstance(req, dict) or set(req) != set(cls.__slots__):
            raise ValueError("not a transfer request")
        buffer, token, op, offset, nbytes = (req[name] for name in cls.__slots__)
        numbers = (buffer, offset, nbytes)
        if not all(type(n) is int and n >= 0 for n in numbers) or not isinstance(token, str):
            raise ValueError("a transfer request with fields of the wrong type or sign")
        if op not in _OPS:
            raise ValueError(f"a transfer request for {op!r}, not one of {_OPS}")
        return cls(buffer=buffer, token=token, op=op, offset=offset, nbytes=nbytes)


def _ask(sock: socket.socket, request: _Request) -> str | None:
    """Send `request`; None when the owner accepted it, else the owner's reason (and it closes
    the connection). OSError when the connection is broken."""
    sock.sendall(request.pack())
    if _recv_exactly(sock, 1) == _OK:
        return None
    return sock.recv(4096).decode(errors="replace")


def _refusal(req: _Request, found: tuple[Region, str, bool] | None) -> str | None:
    """Why the owner refuses `req` for the buffer it `found` under that id, or None."""
    if found is None or not secrets.compare_digest(found[1], req.token):
        return "buffer not registered (dropped?)"
    region, _, writable = found
    if req.op != "read" and not writable:
        return READ_ONLY.format(req.buffer)
    if req.offset + req.nbytes > region.nbytes:
        return "transfer runs past the end of the buffer"
    return None


class _Refused(ConnectionError):
    """Raised by a reader's transfer when the owner refused the request (and said why)."""


def _granted(sock: socket.socket, refusal: str | None) -> socket.socket:
    if refusal is not None:
        sock.close()
        raise _Refused(refusal)
    return sock


class _Idle:
    """A reader's open connections to owners that no transfer is using (any thread), kept
    while the trio run that kept the first of them runs: a system task closes those left idle
    for a whole ``IDLE`` period (an owner that went away leaves no descriptor behind), and the
    rest when the run ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: dict[tuple[str, int], list[tuple[socket.socket, int]]] = {}
        self._period = 0  # sweeps so far: each kept connection notes the one it was kept in
        self.held = False

    def keep_for_this_run(self) -> None:
        if not self.held:
            self.held = True
            trio.lowlevel.spawn_system_task(self._hold, name="otpmesh-rdma-tcp-idle")

    async def _hold(self) -> None:
        try:
            while True:
                await trio.sleep(IDLE)
                self._sweep(everything=False)
        finally:
            self._sweep(everything=True)

    def _sweep(self, *, everything: bool) -> None:
        stale: list[socket.socket] = []
        with self._lock:
            self._period += 1
            for address, kept in list(self._socks.items()):
                fresh = [(s, p) for s, p in kept if not everything and p >= self._period - 1]
                stale += [s for s, p in kept if everything or p < self._period - 1]
                if fresh:
                    self._socks[address] = fresh
                else:
                    del self._socks[address]
            if everything:
                self.held = False
        for sock in stale:
            sock.close()

    def take(self, address: tuple[str, int]) -> socket.socket | None:
        with self._lock:
            socks = self._socks.get(address)
            return socks.pop()[0] if socks else None

    def give(self, address: tuple[str, int], sock: socket.socket) -> None:
        with self._lock:
            socks = self._socks.setdefault(address, [])
            if self.held and len(socks) < _KEEP:
                socks.append((sock, self._period))
                return
        sock.close()

    def count(self) -> int:
        """How many connections are kept idle now."""
        with self._lock:
            return sum(len(kept) for kept in self._socks.values())


class TcpBackend:
    name: ClassVar[str] = "tcp"

    def __init__(self) -> None:
        self._buffers: dict[int, tuple[Region, str, bool]] = {}  # region, token, writable
        self._address: tuple[str, int] | None = None
        self._listener: socket.socket | None = None
        self._idle = _Idle()
        self._idle_conns: dict[socket.socket, trio.CancelScope] = {}  # owner side, oldest first

    def unavailable(self) -> str | None:
        return None

    # ---------------------------------------------------------------- owner

    def register(self, buffer_id: int, region: Region, *, writable: bool) -> dict[str, Any]:
        host, port = self._listen()
        token = secrets.token_hex(16)
        self._buffers[buffer_id] = (region, token, writable)
        return {"host": host, "port": port, "token": token, "buffer": buffer_id}

    def unregister(self, buffer_id: int) -> None:
        self._buffers.pop(buffer_id, None)

    def _listen(self) -> tuple[str, int]:
        if self._address is None:
            host = os.environ.get("OTPMESH_RDMA_TCP_HOST", "127.0.0.1")
            listener = socket.create_server((host, 0))
            self._listener = listener
            self._address = (host, listener.getsockname()[1])
            trio.lowlevel.spawn_system_task(self._accept_loop, listener, name="otpmesh-rdma-tcp")
        return self._address

    async def _accept_loop(self, listener: socket.socket) -> None:
        # A system task: it must never raise (that would end the whole trio run).
        log = logging.getLogger("otpmesh.rdma")
        try:
            sock = trio.socket.from_stdlib_socket(listener)
            async with trio.open_nursery() as nursery:
                while True:
                    try:
                        conn, _ = await sock.accept()
                    except OSError as exc:
                        if exc.errno not in _OUT_OF_RESOURCES:
                            raise
                        log.warning("tcp backend: cannot accept a connection now: %s", exc)
                        await trio.sleep(_RETRY_ACCEPT)  # descriptors or memory come back
                        continue
                    nursery.start_soon(self._serve_connection, socket.socket(fileno=conn.detach()))
        except Exception:
            log.exception("the tcp backend stopped serving")
        finally:
            listener.close()

    async def _serve_connection(self, sock: socket.socket) -> None:
        # Anyone on the network may connect: nothing one connection sends may end the listener,
        # and none gets a thread before its request proved it holds a buffer's token.
        with sock:
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while True:
                    with trio.CancelScope(deadline=trio.current_time() + IDLE) as idle:
                        self._idle_conns[sock] = idle  # the oldest goes when there are too many
                        while len(self._idle_conns) > _MAX_IDLE:
                            self._idle_conns.pop(next(iter(self._idle_conns))).cancel()
                        try:
                            await trio.lowlevel.wait_readable(sock)
                        finally:
                            self._idle_conns.pop(sock, None)
                    if idle.cancelled_caught:
                        return
                    accepted = await self._accept_request(sock)
                    if accepted is None:
                        return
                    sock.settimeout(TIMEOUT)  # blocking, in a thread, for the bytes
                    try:
                        if not await trio.to_thread.run_sync(self._move_bytes, sock, *accepted):
                            return
                    finally:
                        sock.setblocking(False)
            except Exception:
                logging.getLogger("otpmesh.rdma").exception("a tcp transfer connection failed")

    async def _accept_request(self, sock: socket.socket) -> tuple[str, memoryview] | None:
        """Read and check the next request on `sock` (non-blocking, within ``TIMEOUT`` for all
        of it): what to move, once the owner said yes; None when the connection must close."""
        try:
            with trio.fail_after(TIMEOUT):
                (size,) = _LEN.unpack(await _receive(sock, _LEN.size))
                if size > _REQUEST_MAX:
                    return None
                req = _Request.parse(await _receive(sock, size))
                found = self._buffers.get(req.buffer)
                refusal = _refusal(req, found)
                if refusal is not None or found is None:
                    sock.send(_FAIL + (refusal or "").encode()[:1000])  # fits any socket buffer
                    return None
                sock.send(_OK)
                return req.op, _view(found[0], req.offset, req.nbytes)
        except (OSError, ValueError, trio.TooSlowError):  # gone, stalled, or not one of ours
            return None

    @staticmethod
    def _move_bytes(sock: socket.socket, op: str, view: memoryview) -> bool:
        """Move an accepted request's bytes; True when the connection may carry another."""
        try:
            if op == "read":
                _send_view(sock, view)
            else:
                _recv_into(sock, view)
                sock.sendall(_OK)
            return True
        except OSError:  # the reader went away or stalled
            return False

    # ---------------------------------------------------------------- reader

    def reaches(self, entry: dict[str, Any], peer: Peer) -> bool:
        return True

    async def read(self, entry: dict[str, Any], peer: Peer, dst: Region, offset: int) -> None:
        await self._move(entry, "read", dst, offset)

    async def write(self, entry: dict[str, Any], peer: Peer, src: Region, offset: int) -> None:
        await self._move(entry, "write", src, offset)

    async def _move(self, entry: dict[str, Any], op: str, local: Region, offset: int) -> None:
        self._idle.keep_for_this_run()
        parts = _slices(local.nbytes)
        if len(parts) == 1:
            await trio.to_thread.run_sync(self._transfer, entry, op, local, offset)
            return
        failures: list[OSError] = []

        async def part(start: int, nbytes: int) -> None:
            region = Region(local.address + start, nbytes)
            try:
                await trio.to_thread.run_sync(self._transfer, entry, op, region, offset + start)
            except OSError as exc:
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            for start, nbytes in parts:
                nursery.start_soon(part, start, nbytes)
        if failures:
            raise failures[0]

    def _transfer(self, entry: dict[str, Any], op: str, local: Region, offset: int) -> None:
        address = (entry["host"], entry["port"])
        request = _Request(
            buffer=entry["buffer"], token=entry["token"], op=op, offset=offset, nbytes=local.nbytes
        )
        sock = self._accepted(address, request)
        try:
            view = _view(local, 0, local.nbytes)
            if op == "read":
                _recv_into(sock, view)
            else:
                _send_view(sock, view)
                if _recv_exactly(sock, 1) != _OK:
                    raise ConnectionError("the owner did not confirm the write")
        except BaseException:
            sock.close()  # mid-transfer: the stream is out of step, never reuse it
            raise
        self._idle.give(address, sock)

    def _accepted(self, address: tuple[str, int], request: _Request) -> socket.socket:
        """A connection to the owner at `address` on which it accepted `request`: an idle one
        while the owner keeps it open, else a new one."""
        idle = self._idle.take(address)
        if idle is not None:
            try:
                return _granted(idle, _ask(idle, request))
            except _Refused:
                raise
            except ConnectionError:  # the owner closed it while idle: nothing moved, start anew
                idle.close()
            except BaseException:
                idle.close()
                raise
        sock = socket.create_connection(address, timeout=TIMEOUT)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return _granted(sock, _ask(sock, request))
        except BaseException:
            sock.close()
            raise

    async def serve(self, op: str, payload: Any, caller: Caller) -> Any:
        raise ValueError(f"the tcp backend has no request {op!r}")
