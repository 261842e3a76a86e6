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

The requests' framing and the loops that move bytes are ``_tcpwire.py``'s; the reader's idle
connections ``_tcpidle.py``'s.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from typing import Any, ClassVar

import trio

from .._wire._accepting import Acceptor
from .._wire._owntasks import spawn as spawn_own
from .._wire._refusals import RefusalLog
from .._wire._unproven import Unproven
from ._backend import Caller, Peer, Region
from ._tcpidle import IdleConnections
from ._tcpwire import (
    FAIL,
    LEN,
    OK,
    REQUEST_MAX,
    Refused,
    Request,
    ask,
    granted,
    receive,
    recv_exactly,
    recv_into,
    send_view,
    view_of,
    why_refused,
)

log = logging.getLogger("otpmesh.rdma")

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


def _slices(nbytes: int) -> list[tuple[int, int]]:
    """(start, size) of each stream's part of a transfer of `nbytes`, page-aligned."""
    if nbytes < PARALLEL_ABOVE:
        return [(0, nbytes)]
    step = (nbytes // STREAMS + 4095) & ~4095
    return [(start, min(step, nbytes - start)) for start in range(0, nbytes, step)]


class TcpBackend:
    name: ClassVar[str] = "tcp"

    def __init__(self) -> None:
        self._buffers: dict[int, tuple[Region, str, bool]] = {}  # region, token, writable
        self._address: tuple[str, int] | None = None
        self._listener: socket.socket | None = None
        self._idle = IdleConnections(IDLE, _KEEP)
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
                (size,) = LEN.unpack(await receive(sock, LEN.size))
                if size > REQUEST_MAX:
                    raise ValueError(f"a request of {size} bytes (at most {REQUEST_MAX})")
                req = Request.parse(await receive(sock, size))
                found = self._buffers.get(req.buffer)
                refusal = why_refused(req, found)
                if refusal is not None or found is None:
                    sock.send(FAIL + (refusal or "").encode()[:1000])  # fits any socket buffer
                    return None
                sock.send(OK)
                return req.op, view_of(found[0], req.offset, req.nbytes)
        except (OSError, ValueError, trio.TooSlowError) as exc:  # gone, stalled, not ours
            if not isinstance(exc, OSError):
                self.refusals.refused(host, str(exc) or "stalled mid-request")
            return None

    @staticmethod
    def _move_bytes(sock: socket.socket, op: str, view: memoryview) -> bool:
        """Move an accepted request's bytes; True when the connection may carry another."""
        try:
            if op == "read":
                send_view(sock, view)
            else:
                recv_into(sock, view)
                sock.sendall(OK)
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
        request = Request(
            buffer=entry["buffer"], token=entry["token"], op=op, offset=offset, nbytes=local.nbytes
        )
        sock = self._accepted(address, request)
        try:
            view = view_of(local, 0, local.nbytes)
            if op == "read":
                recv_into(sock, view)
            else:
                send_view(sock, view)
                if recv_exactly(sock, 1) != OK:
                    raise ConnectionError("the owner did not confirm the write")
        except BaseException:
            sock.close()  # mid-transfer: the stream is out of step, never reuse it
            raise
        self._idle.give(address, sock)

    def _accepted(self, address: tuple[str, int], request: Request) -> socket.socket:
        """A connection to the owner at `address` on which it accepted `request`: an idle one
        while the owner keeps it open, else a new one."""
        idle = self._idle.take(address)
        if idle is not None:
            try:
                return granted(idle, ask(idle, request))
            except Refused:
                raise
            except ConnectionError:  # the owner closed it while idle: nothing moved, start anew
                idle.close()
            except BaseException:
                idle.close()
                raise
        sock = socket.create_connection(address, timeout=TIMEOUT)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return granted(sock, ask(sock, request))
        except BaseException:
            sock.close()
            raise

    async def serve(self, op: str, payload: Any, caller: Caller) -> Any:
        if op == "listen":  # a token holder's reader cannot use anything better
            return list(self.listen())
        raise ValueError(f"the tcp backend has no request {op!r}")
