"""The ``tcp`` backend: the last resort (other hosts, nothing better), on connections of its own
(never the control mailbox), chunked.

The owner listens only once a reader asks for its address (``serve("listen")``, which the
owner's registry runs for token holders only): most values never travel by tcp. It listens on
loopback (``OTPMESH_RDMA_TCP_HOST`` to bind elsewhere) and serves each request straight from /
into the tensor's memory; the owner's answer to a pin carries a random per-buffer token that
every request must present. A request is read and checked in trio (all of it within
``TIMEOUT``); only an accepted one gets a thread, for its bytes. Until its first request is
accepted, a connection holds a slot of the listener's bounded ``Unproven`` set (per host, the
oldest evicted: _wire/_unproven.py) and must send its first bytes within
``FIRST_BYTES_TIMEOUT``. A read-only buffer (a tensor sent in a message) refuses writes.

A reader keeps its connections to an owner open for later transfers (a connection authorizes
nothing: each request on it presents its own buffer's token) and moves a transfer of
``PARALLEL_ABOVE`` bytes or more as ``STREAMS`` slices on as many connections at once: one stream
leaves a core idle (between two hosts on one 2-core machine, two streams moved 256 MiB 1.4x as
fast as one). The owner waits for a connection's next request without a thread, and closes it
after ``IDLE`` seconds without one (or sooner, the longest-waiting first, when more than
``_MAX_IDLE`` wait); a reader closes one it kept unused through a whole ``IDLE`` period. When the
process runs out of descriptors, the owner stops accepting for a moment, never for good, and
says so once (_wire/_accepting.py).
"""

from __future__ import annotations

import ctypes
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

from .._wire._accepting import Acceptor
from .._wire._owntasks import spawn as spawn_own
from .._wire._refusals import RefusalLog
from .._wire._unproven import Unproven
from ._backend import Caller, Peer, Region
from ._handle import tokens_match

log = logging.getLogger("otpmesh.rdma")

_LEN = struct.Struct(">I")
_CHUNK = 4 << 20
_OK, _FAIL = b"\x00", b"\x01"
_OPS = ("read", "write")
#: The longest request a reader of ours sends (its msgpack header), with room to spare.
_REQUEST_MAX = 1024
#: Seconds a peer may stall mid-request or mid-transfer before its connection is dropped.
TIMEOUT = 30.0
#: Seconds a new connection has to send the first bytes of its first request (a reader sends it
#: as soon as it connects); until a request presents a buffer's token, the connection holds a
#: slot of the listener's bounded ``Unproven`` set (_wire/_unproven.py), per reader host.
FIRST_BYTES_TIMEOUT = 3.0
#: Seconds the owner keeps a connection open waiting for its next request.
IDLE = 60.0
#: Transfers this large or larger move as `STREAMS` slices at once.
PARALLEL_ABOVE = 16 << 20
STREAMS = 2
#: Idle connections a reader keeps per owner (more are closed when their transfer ends).
_KEEP = STREAMS
#: Connections an owner keeps waiting for a next request (the longest-waiting goes first).
_MAX_IDLE = 64
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
        if not token.isascii():  # ours are hex; compare_digest refuses other str
            raise ValueError("a transfer request whose token is not ASCII")
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
    if found is None or not tokens_match(req.token, found[1]):
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
            spawn_own(self._hold, name="otpmesh-rdma-tcp-idle")

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
        #: Connections that presented no token yet, and the accept loop (once listening).
        self.unproven = Unproven()
        self.acceptor: Acceptor | None = None
        #: Refused or failed connections, logged once per host, then summarized.
        self.refusals = RefusalLog(log)

    def unavailable(self) -> str | None:
        return None

    # ---------------------------------------------------------------- owner

    def register(self, buffer_id: int, region: Region, *, writable: bool) -> dict[str, Any]:
        # No listening yet: most values never travel by tcp (shared memory serves this host).
        # A reader that must use tcp asks for the address (``serve("listen")``) first.
        token = secrets.token_hex(16)
        self._buffers[buffer_id] = (region, token, writable)
        return {"token": token, "buffer": buffer_id}

    def unregister(self, buffer_id: int) -> None:
        self._buffers.pop(buffer_id, None)

    def listen(self) -> tuple[str, int]:
        """The address this owner serves transfers on, listening from the first call on."""
        if self._address is None:
            host = os.environ.get("OTPMESH_RDMA_TCP_HOST", "127.0.0.1")
            listener = socket.create_server((host, 0))
            self._listener = listener
            self._address = (host, listener.getsockname()[1])
            spawn_own(self._accept_loop, listener, name="otpmesh-rdma-tcp")
        return self._address

    async def _accept_loop(self, listener: socket.socket) -> None:
        # A system task: it must never raise (that would end the whole trio run).
        try:
            with trio.socket.from_stdlib_socket(listener) as sock:
                host, port = listener.getsockname()[:2]
                self.acceptor = Acceptor(sock, log, f"tcp backend {host}:{port}")
                async with trio.open_nursery() as nursery:
                    while True:
                        conn, address = await self.acceptor.accept()
                        raw = socket.socket(fileno=conn.detach())
                        nursery.start_soon(self._serve_connection, raw, str(address[0]))
        except Exception:
            log.exception("the tcp backend stopped serving")
        finally:
            listener.close()
            if self._listener is listener:  # a later reader's "listen" makes a new one
                self._listener = self._address = None

    async def _serve_connection(self, sock: socket.socket, host: str) -> None:
        # Anyone on the network may connect: nothing one connection sends may end the listener,
        # none gets a thread before its request proved it holds a buffer's token, and those that
        # proved nothing yet hold a bounded share of the listener, per host.
        with sock:
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                accepted = await self._first_request(sock, host)
                while accepted is not None:
                    sock.settimeout(TIMEOUT)  # blocking, in a thread, for the bytes
                    try:
                        if not await trio.to_thread.run_sync(self._move_bytes, sock, *accepted):
                            return
                    finally:
                        sock.setblocking(False)
                    accepted = await self._next_request(sock, host)
            except Exception as exc:  # a bug, not a peer's doing: still one line per host
                self.refusals.refused(host, f"a tcp transfer connection failed: {exc!r}")

    async def _first_request(self, sock: socket.socket, host: str) -> tuple[str, memoryview] | None:
        """The first request of a new connection, while it holds a slot among the unproven:
        its first bytes within ``FIRST_BYTES_TIMEOUT``, the rest within ``TIMEOUT``."""
        accepted = None  # also when the slot is evicted (its scope cancelled) mid-request
        with self.unproven.hold(host) as slot:
            with trio.move_on_after(FIRST_BYTES_TIMEOUT) as waiting:
                await trio.lowlevel.wait_readable(sock)
            if waiting.cancelled_caught:
                self.refusals.refused(host, f"sent nothing within {FIRST_BYTES_TIMEOUT:g} s")
                return None
            accepted = await self._accept_request(sock, host)
        if slot.evicted:
            self.refusals.refused(host, "evicted by newer connections that proved nothing")
            return None
        return accepted

    async def _next_request(self, sock: socket.socket, host: str) -> tuple[str, memoryview] | None:
        """A later request on a connection that presented a token: it waits idle (one of at
        most ``_MAX_IDLE``, the longest-waiting closed first) for up to ``IDLE`` seconds."""
        with trio.CancelScope(deadline=trio.current_time() + IDLE) as idle:
            self._idle_conns[sock] = idle  # the oldest goes when there are too many
            while len(self._idle_conns) > _MAX_IDLE:
                self._idle_conns.pop(next(iter(self._idle_conns))).cancel()
            try:
                await trio.lowlevel.wait_readable(sock)
            finally:
                self._idle_conns.pop(sock, None)
        if idle.cancelled_caught:
            return None
        return await self._accept_request(sock, host)

    async def _accept_request(
        self, sock: socket.socket, host: str
    ) -> tuple[str, memoryview] | None:
        """Read and check the next request on `sock` (non-blocking, within ``TIMEOUT`` for all
        of it): what to move, once the owner said yes; None when the connection must close."""
        try:
            with trio.fail_after(TIMEOUT):
                (size,) = _LEN.unpack(await _receive(sock, _LEN.size))
                if size > _REQUEST_MAX:
                    raise ValueError(f"a request of {size} bytes (at most {_REQUEST_MAX})")
                req = _Request.parse(await _receive(sock, size))
                found = self._buffers.get(req.buffer)
                refusal = _refusal(req, found)
                if refusal is not None or found is None:
                    sock.send(_FAIL + (refusal or "").encode()[:1000])  # fits any socket buffer
                    return None
                sock.send(_OK)
                return req.op, _view(found[0], req.offset, req.nbytes)
        except (OSError, ValueError, trio.TooSlowError) as exc:  # gone, stalled, not ours
            if not isinstance(exc, OSError):
                self.refusals.refused(host, str(exc) or "stalled mid-request")
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
        await self._move(entry, peer, "read", dst, offset)

    async def write(self, entry: dict[str, Any], peer: Peer, src: Region, offset: int) -> None:
        await self._move(entry, peer, "write", src, offset)

    async def _move(
        self, entry: dict[str, Any], peer: Peer, op: str, local: Region, offset: int
    ) -> None:
        self._idle.keep_for_this_run()
        # The owner listens from the first such request on (a round trip on the control
        # connection, small beside a transfer big enough for the channel).
        answer = await peer.request(self.name, "listen", None)
        if not (isinstance(answer, list) and len(answer) == 2 and type(answer[1]) is int):
            raise ConnectionError(f"the owner answered {answer!r:.80} for its tcp address")
        address = (str(answer[0]), answer[1])
        parts = _slices(local.nbytes)
        if len(parts) == 1:
            await trio.to_thread.run_sync(self._transfer, entry, address, op, local, offset)
            return
        failures: list[OSError] = []

        async def part(start: int, nbytes: int) -> None:
            region = Region(local.address + start, nbytes)
            try:
                await trio.to_thread.run_sync(
                    self._transfer, entry, address, op, region, offset + start
                )
            except OSError as exc:
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            for start, nbytes in parts:
                nursery.start_soon(part, start, nbytes)
        if failures:
            raise failures[0]

    def _transfer(
        self, entry: dict[str, Any], address: tuple[str, int], op: str, local: Region, offset: int
    ) -> None:
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
        if op == "listen":  # a token holder's reader cannot use anything better
            return list(self.listen())
        raise ValueError(f"the tcp backend has no request {op!r}")
