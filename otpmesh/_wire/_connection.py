"""A connection: length-prefixed msgpack frames (_framing.py) over a non-blocking socket that
``dial`` or ``accept`` opened and proved (_handshake.py), both directions at once.

On a Unix socket a frame may also carry file descriptors (``SCM_RIGHTS``, ``Connection.pass_fd``):
how the tensor channel hands a reader its snapshot file without the reader touching the owner's
process (which may not let it: docs/security.md).

A broken frame closes that one connection; nothing else is affected.
"""

from __future__ import annotations

import array
import contextvars
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from .._core._errors import ProtocolError
from ._framemac import FrameMac
from ._framing import FrameDecoder, frame_header

if TYPE_CHECKING:
    from ._refusals import RefusalLog

log = logging.getLogger("otpmesh.wire")

_RECV_CHUNK = 1 << 18
# Reads in a row, the socket never found empty, before the reading task lets others run.
_STREAK = 8
# Frames smaller than this are coalesced into one write; bigger ones are written as they are.
_COALESCE_LIMIT = 1 << 18
# A caller waits for the writer once this much is queued on one connection (backpressure).
_HIGH_WATER = 16 << 20
#: Descriptors passed in one write, and kept received but not yet taken, per connection. Only a
#: tensor channel owner sends them, one per pin answered; a peer that sends more than a reader
#: takes cannot fill this process's descriptor table: the oldest are closed.
MAX_PASSED_FDS = 16
_FD_SPACE = socket.CMSG_SPACE(MAX_PASSED_FDS * 4) if hasattr(socket, "CMSG_SPACE") else 0


class _HandedOver:
    """A frame handed the connection over (``release``): reading ends."""


_HANDED_OVER = _HandedOver()
_ENDED = object()  # a caller reading in the reader's place met the end of stream

#: Called with the connection, the message and the channel tensors its frame named.
MessageHandler = Callable[["Connection", Any, Any], "Awaitable[None] | None"]


class Connection:
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
        self._unix = sock.family == socket.AF_UNIX and _FD_SPACE > 0
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

    @property
    def passes_fds(self) -> bool:
        """Whether descriptors can travel on this connection (a Unix socket: the same host)."""
        return self._unix

    def pass_fd(self, fd: int) -> tuple[int, int]:
        """Send (a duplicate of) descriptor `fd` to the peer with the next bytes written on this
        connection, so it arrives no later than the next frame sent; return the key the peer
        takes it by (``take_fd``): the file's (st_dev, st_ino). Unix sockets only."""
        if not self._unix:
            raise ValueError(f"connection to {self.peer} cannot pass descriptors (not Unix)")
        if self.closed:  # nothing would send (or close) the duplicate
            raise trio.ClosedResourceError(f"connection to {self.peer} is closed")
        st = os.fstat(fd)
        self._fds_out.append(os.dup(fd))
        return st.st_dev, st.st_ino

    def take_fd(self, key: Any) -> int | None:
        """The descriptor the peer passed for file `key` (``pass_fd``'s answer there), now this
        caller's to close; None if none arrived (or it was closed, being too old)."""
        if type(key) is not list or len(key) != 2 or not all(type(k) is int for k in key):
            return None
        return self._fds_in.pop((key[0], key[1]), None)

    def _send(self, data: bytes | bytearray | memoryview) -> int:
        if not self._fds_out:
            return self.sock.send(data)
        fds = self._fds_out[:MAX_PASSED_FDS]
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sent = self.sock.sendmsg([data], rights)  # BlockingIOError: nothing went, fds stay
        del self._fds_out[: len(fds)]
        for fd in fds:  # the peer holds its own now
            os.close(fd)
        return sent

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
            _RECV_CHUNK, _FD_SPACE, socket.MSG_CMSG_CLOEXEC
        )
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
                for fd in fds:
                    self._keep_fd(fd)
        return data

    def _keep_fd(self, fd: int) -> None:
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            return
        old = self._fds_in.pop((st.st_dev, st.st_ino), None)
        if old is not None:
            os.close(old)
        self._fds_in[st.st_dev, st.st_ino] = fd
        while len(self._fds_in) > MAX_PASSED_FDS:  # a peer passing what nobody takes
            os.close(self._fds_in.pop(next(iter(self._fds_in))))

    def _close_fds(self) -> None:
        for fd in [*self._fds_out, *self._fds_in.values()]:
            os.close(fd)
        self._fds_out.clear()
        self._fds_in.clear()

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
            if streak >= _STREAK:  # a busy peer must not starve this process's other tasks
                streak = 0
                await trio.lowlevel.checkpoint()

    def _lent_out(self) -> bool:
        """Whether a caller reads in the reader's place now (``read_for``)."""
        return self._lent

    async def _step_aside(self) -> None:
        """The reader waits while a caller reads in its place, until it hands the socket back
        (or takes it again before the reader ran: then it waits again, at once)."""
        while self._lent:
            self._aside = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort_aside)

    def _abort_aside(self, _: Any) -> trio.lowlevel.Abort:
        self._aside = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _hand_back(self) -> None:
        self._lent = False
        task, self._aside = self._aside, None
        if task is not None:
            trio.lowlevel.reschedule(task)

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

    async def read_for(self, done: Callable[[], bool]) -> None:
        """Until `done()`: read and handle what comes on this connection in its reader's place
        (a reply, and whatever else arrives, exactly as the reader would), then hand the socket
        back. The one caller waiting on a connection is then woken by the socket itself, not
        by the reader rescheduling it a scheduler pass later: a unicast round trip takes one
        pass, as a bare echo does (the reader's own pass, to step aside and to take the socket
        back, comes while the peer works). Returns at once, leaving the reader to deliver,
        when the reader is busy, another caller reads, other calls are out on this connection
        (pipelined: their replies come together, and the reader delivers them in one pass),
        or what it read waits to be handled."""
        if (
            not self._idle
            or self._lent
            or self.closed
            or self._handed is not None
            or len(self.pending) > 1
        ):
            return
        sock = self.sock
        self._lent = True
        if self._reader_waits:
            if self._writing:  # it may wait for the socket too: a kick would wake it as well
                self._lent = False
                return
            self._kick_reader()  # it leaves its wait at once, and steps aside
        streak = 0
        try:
            while not done():
                if self._drained:
                    streak = 0
                    await trio.lowlevel.wait_readable(sock)
                elif streak >= _STREAK:  # a peer that keeps the socket full: as the reader does
                    streak = 0
                    await trio.lowlevel.checkpoint()
                streak += 1
                left = self._in_readers_place()
                if left is not None:
                    if left is not _ENDED:
                        self._handed = left  # the reader goes on from there
                    return  # at the end of stream, the reader reads it too and ends
        except trio.ClosedResourceError:
            pass  # the connection is closing: its calls fail as it closes
        except Exception as exc:  # waiting for the socket failed: the reader's to end
            self._handed = exc
        finally:
            self._hand_back()

    def read_waiting(self) -> None:
        """Handle, in the reader's stead, what already waits on the socket while the reader
        waits for it: a broadcast's caller sweeping its connections once its frames are out
        takes the replies already there in its own pass, and no reader is woken for them (a
        level-triggered epoll does not report a socket emptied before it was asked). What it
        cannot finish (a full mailbox, a broken frame) is left to the reader, woken for it."""
        if (
            not self._reader_waits
            or self._lent
            or self._writing  # a kick would wake the writer too: leave it all to the reader
            or self._handed is not None
            or self.closed
        ):
            return
        left = self._in_readers_place()
        if left is not None and left is not _ENDED:  # the end: the reader, woken by it, reads it
            self._handed = left
            self._kick_reader()

    def _in_readers_place(self) -> object:
        """One read, and the frames it brought handled, by a caller in the reader's stead and
        in the reader's context (what a handler sets there is not the caller's): None when
        all were handled (or nothing was there); _ENDED at the end of stream; otherwise what
        the reader must go on from: the awaitable of a handler that must wait, _HANDED_OVER,
        or the error (a broken frame, a lost connection) it ends the connection with."""
        context = self._context
        try:
            if not context.run(self._read):
                return _ENDED
            return context.run(self._take_frames)
        except Exception as exc:
            return exc

    def _kick_reader(self) -> None:
        """Wake the reader from its wait for the socket, at once (it looks for what a caller
        left it, or steps aside while one reads)."""
        self._kicked = True
        trio.lowlevel.notify_closing(self.sock)

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
