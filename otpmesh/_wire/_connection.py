"""A connection: length-prefixed msgpack frames (_framing.py) over a non-blocking socket that
``dial`` or ``accept`` opened and proved (_handshake.py), both directions at once.

On a Unix socket a frame may also carry file descriptors (``SCM_RIGHTS``, ``Connection.pass_fd``,
_fdpassing.py). A caller may read in the reader's place (``read_for``, ``read_waiting``,
_inplace.py).

A broken frame closes that one connection; nothing else is affected.
"""

from __future__ import annotations

import array
import contextvars
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from .._core._errors import ProtocolError
from ._fdpassing import FD_SPACE, PassesFds
from ._framemac import FrameMac
from ._framing import FrameDecoder, frame_header
from ._inplace import STREAK, ReadsInPlace

if TYPE_CHECKING:
    from ._refusals import RefusalLog

log = logging.getLogger("otpmesh.wire")

_RECV_CHUNK = 1 << 18
# Frames smaller than this are coalesced into one write; bigger ones are written as they are.
_COALESCE_LIMIT = 1 << 18
# A caller waits for the writer once this much is queued on one connection (backpressure).
_HIGH_WATER = 16 << 20


class _HandedOver:
    """A frame handed the connection over (``release``): reading ends."""


_HANDED_OVER = _HandedOver()

#: Called with the connection, the message and the channel tensors its frame named.
MessageHandler = Callable[["Connection", Any, Any], "Awaitable[None] | None"]


class Connection(PassesFds, ReadsInPlace):
    """One framed, bidirectional connection over a non-blocking socket.

    A frame is written straight to the socket by the task that sends it when nothing is queued
    (no task switch on the hot path); what the socket cannot take at once is queued for the
    writer task, which keeps frames in order. ``on_message`` is called for every decoded message,
    in order; it returns None when it handled the message at once, or an awaitable when it must
    wait (a full mailbox), which pauses reading: that is how backpressure reaches the sender.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        peer: str,
        decode: Callable[[bytes], tuple[Any, Any]],
        on_message: MessageHandler,
        mac: FrameMac | None = None,
        peer_pid: int | None = None,
    ) -> None:
        self.sock = sock
        #: The kernel's word on the peer process of an accepted Unix connection (``SO_PEERCRED``,
        #: taken when it was accepted): None over TCP and for connections this side dialed.
        self.peer_pid = peer_pid
        self._mac = mac  # over TCP: every frame carries a MAC (_framemac.py)
        self.peer = peer
        self._decode = decode
        self._on_message = on_message
        self._out: list[bytes | bytearray | memoryview] = []
        self._out_bytes = 0
        # Set by a direct write: frames sent after it are queued for the writer task and go out
        # together in one write (a burst of calls in one scheduler pass: one write, not one
        # each). Cleared by the reader on each read, and by the writer once it has emptied the
        # queue: a write is direct again. A direct write wakes no task: a lone frame (a reply,
        # a unicast call) costs no scheduler pass beyond its own.
        self._batching = False
        self._writing = False  # the writer task is sending (it may wait for the socket)
        self._writer_lot = trio.lowlevel.ParkingLot()
        self._drain_lot = trio.lowlevel.ParkingLot()
        self.closed = False
        self.close_reason: str | None = None
        self._released = False  # handed over (``release``): its socket is not closed here
        #: Where a protocol error the peer caused is logged, rate-limited (the node's); None:
        #: at ERROR, each time.
        self.refusals: RefusalLog | None = None
        self._unix = sock.family == socket.AF_UNIX and FD_SPACE > 0
        self._fds_out: list[int] = []  # our duplicates, sent with the next bytes written
        self._fds_in: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> descriptor
        # The read side: bytes to frames, frames handled in order, by the reader task or by a
        # caller in its place (``read_for``).
        self._decoder = FrameDecoder()
        self._frames: list[bytes] = []
        self._next = 0  # frames[_next:] are still to be handled
        self._drained = True  # the last read emptied the socket: wait for it before reading
        self._idle = False  # the reader waits (for the socket, or for a caller to hand it back)
        self._reader_waits = False  # the reader is in wait_readable
        self._kicked = False  # a caller woke it from there to take its place
        self._aside: trio.lowlevel.Task | None = None  # the reader, waiting while lent
        self._lent = False  # a caller reads in the reader's place
        self._handed: Any = None  # what a caller left the reader: an error or an awaitable
        self._context = contextvars.Context()  # the reader task's, once it runs
        #: Outstanding calls sent on this connection, by call id (owned by the node).
        self.pending: dict[int, Any] = {}
        self.next_call_id = 0

    def expect_reply(self, group: Any, index: int) -> int:
        """A fresh call id whose reply goes to ``group.deliver(index, ...)``; the group's
        ``cancels[index]`` forgets it (a caller that gives up ignores a late reply)."""
        call_id = self.next_call_id
        self.next_call_id += 1
        self.pending[call_id] = (group, index)
        group.cancels[index] = partial(self.pending.pop, call_id, None)
        return call_id

    def send_nowait(self, *parts: bytes | bytearray | memoryview) -> None:
        """Write one frame (its payload given as parts), or queue what the socket cannot take."""
        if self.closed:
            raise trio.ClosedResourceError(f"connection to {self.peer} is closed")
        if self._mac is not None:
            parts = (*parts, self._mac.seal(parts))
        size = sum(map(len, parts))
        header = frame_header(size)
        if self._out or self._batching or self._writing or size > _COALESCE_LIMIT:
            self._out.append(header)
            self._out.extend(parts)
            self._out_bytes += size + 4
            self._writer_lot.unpark()
            return
        data = b"".join((header, *parts))
        self._batching = True
        try:
            sent = self._send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._mark_closed(f"connection lost: {exc}")
            return
        if sent < len(data):
            self._out.append(memoryview(data)[sent:])
            self._out_bytes += len(data) - sent
            self._writer_lot.unpark()

    async def _send_all(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            try:
                view = view[self._send(view) :]
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.sock)

    def _recv(self) -> bytes:
        if not self._unix:
            return self.sock.recv(_RECV_CHUNK)
        data, ancillary, _flags, _addr = self.sock.recvmsg(
            _RECV_CHUNK, FD_SPACE, socket.MSG_CMSG_CLOEXEC
        )
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
                for fd in fds:
                    self._keep_fd(fd)
        return data

    @property
    def backed_up(self) -> bool:
        """Whether more than the high-water mark is queued: a sender must ``drain`` first."""
        return self._out_bytes > _HIGH_WATER

    async def drain(self) -> None:
        """Wait while more than the high-water mark is queued (writers must not outrun it)."""
        while self._out_bytes > _HIGH_WATER and not self.closed:
            await self._drain_lot.park()

    async def run(self) -> None:
        """Read and write until the peer closes or the protocol breaks; then close."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._guarded, self._write_loop, nursery.cancel_scope)
                await self._guarded(self._read_loop, nursery.cancel_scope)
        finally:
            self._mark_closed("connection closed")
            if not self._released:
                trio.lowlevel.notify_closing(self.sock)
                self.sock.close()
            self._close_fds()

    async def _guarded(self, loop: Callable[[], Awaitable[None]], scope: trio.CancelScope) -> None:
        try:
            await loop()
            reason = "connection closed by peer"
        except ProtocolError as exc:
            reason = f"protocol error: {exc}"
            if self.refusals is None:
                log.error("closing connection to %s: %s", self.peer, exc)
            else:  # the peer decides how often: once per peer, then a summary a minute
                who = self.peer if self.peer_pid is None else f"pid {self.peer_pid} ({self.peer})"
                self.refusals.refused(f"connection {who}", f"closed it: {exc}")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            reason = f"connection lost: {exc or type(exc).__name__}"
        except Exception as exc:
            log.exception("closing connection to %s after an internal error", self.peer)
            reason = f"internal error: {exc!r}"
        self._mark_closed(reason)
        scope.cancel()

    async def _read_loop(self) -> None:
        sock = self.sock
        streak = 0
        self._context = trio.lowlevel.current_task().context
        while True:
            if self._handed is not None or self._next < len(self._frames):
                # What a caller reading in its place left (read_for), or frames still to handle
                # after one whose handler had to wait.
                self._idle = False
                handed, self._handed = self._handed, None
                if isinstance(handed, BaseException):
                    raise handed
                if handed is not None:
                    waiting = handed
                else:
                    waiting = self._take_frames()
                    if waiting is None:
                        continue
                if isinstance(waiting, _HandedOver):
                    return
                await waiting
                continue
            if self._drained or self._lent:
                # The last read took less than it asked for: the socket was empty then, so wait
                # for it rather than ask again (a recv that would fail: a system call per read).
                # Meanwhile a caller may take its place (read_for), until it hands it back.
                streak = 0
                self._idle = True
                if self._lent:
                    await self._step_aside()
                    continue
                self._reader_waits = True
                try:
                    await trio.lowlevel.wait_readable(sock)
                except trio.ClosedResourceError:
                    if not self._kicked or self.closed:
                        raise
                    continue  # a caller took the socket
                finally:
                    self._reader_waits = self._kicked = False
                if self._lent_out():  # readable, but a caller took the socket meanwhile
                    continue
            self._idle = False
            if not self._read():
                return
            waiting = self._take_frames()
            if waiting is not None:
                if isinstance(waiting, _HandedOver):
                    return
                await waiting
                continue
            streak += 1
            if streak >= STREAK:  # a busy peer must not starve this process's other tasks
                streak = 0
                await trio.lowlevel.checkpoint()

    @trio.lowlevel.enable_ki_protection  # in a caller's task too: a stop signal waits for main
    def _read(self) -> bool:
        """One read from the socket into frames to handle; False at its end."""
        try:
            data = self._recv()
        except BlockingIOError:
            self._drained = True
            return True
        self._drained = len(data) < _RECV_CHUNK
        self._batching = False  # new data read: the next frame may go directly again
        if not data:
            if self._decoder.buffered:
                raise ProtocolError(
                    f"truncated frame: stream ended with {self._decoder.buffered} bytes pending"
                )
            return False
        self._frames = self._decoder.feed(data)
        self._next = 0
        return True

    @trio.lowlevel.enable_ki_protection  # no frame half-handled by a stop signal in a caller
    def _take_frames(self) -> Awaitable[None] | _HandedOver | None:
        """Handle the frames read and not yet handled, in order: None once all are; the
        awaitable of one whose handler must wait (a full mailbox: handle the rest after it);
        _HANDED_OVER when one handed the connection over (reading ends)."""
        frames, mac = self._frames, self._mac
        while self._next < len(frames):
            frame = frames[self._next]
            self._next += 1
            message, pending = self._decode(frame if mac is None else mac.open(frame))
            waiting = self._on_message(self, message, pending)
            if self._released:
                if self._decoder.buffered or self._next < len(frames):
                    self.sock.shutdown(socket.SHUT_RDWR)  # its new owner sees it end
                    raise ProtocolError("bytes followed the frame that handed it over")
                return _HANDED_OVER
            if waiting is not None:
                return waiting
        return None

    async def _write_loop(self) -> None:
        while not self.closed:
            if not self._out:
                self._batching = False
                await self._writer_lot.park()
                continue
            out, self._out = self._out, []
            size = self._out_bytes
            self._out_bytes = 0
            self._writing = True  # what is sent meanwhile queues behind these bytes
            try:
                if size <= _COALESCE_LIMIT:
                    await self._send_all(b"".join(out))
                else:  # a long queue: in writes of about the limit each, not one per part
                    for chunk in _writes(out):
                        await self._send_all(chunk)
            finally:
                self._writing = False
            self._drain_lot.unpark_all()

    def release(self, reason: str) -> tuple[socket.socket, FrameMac | None]:
        """Hand this connection's socket and frame-MAC state over to a new owner (a lifeline
        thread), from the ``on_message`` of the frame after which the peer sends nothing until
        the new owner answers: reading stops there, nothing more is sent, and the socket is
        not closed here. A peer that sent more bytes after that frame gets its socket closed."""
        if self._out or self._fds_out:
            raise ProtocolError(f"connection to {self.peer} has frames queued: not handed over")
        self._released = True
        self._mark_closed(reason)
        self._writer_lot.unpark_all()
        return self.sock, self._mac

    def abort(self, reason: str) -> None:
        """Close this connection now (its reader sees end of stream): a peer declared dead."""
        self._mark_closed(reason)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._writer_lot.unpark_all()

    def finish(self) -> None:
        """The peer is dying (known before its socket closes): read what it sent, then end as
        at its end of stream. On a Unix socket every byte it wrote is in this end's receive
        queue already, so a reply it sent just before it died still reaches its caller; it
        can send nothing more."""
        try:
            self.sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def _mark_closed(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = reason
            self._drain_lot.unpark_all()


def _writes(
    parts: list[bytes | bytearray | memoryview],
) -> Iterator[bytes | bytearray | memoryview]:
    """Queued parts as writes: small ones joined up to about ``_COALESCE_LIMIT`` bytes, big
    ones as they are (a burst of 10,000 small frames: a few writes, not one per part)."""
    small: list[bytes | bytearray | memoryview] = []
    size = 0
    for part in parts:
        n = len(part)
        if n > _COALESCE_LIMIT:
            if small:
                yield b"".join(small)
                small, size = [], 0
            yield part
            continue
        small.append(part)
        size += n
        if size >= _COALESCE_LIMIT:
            yield b"".join(small)
            small, size = [], 0
    if small:
        yield b"".join(small)
