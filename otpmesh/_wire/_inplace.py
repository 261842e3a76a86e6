"""A caller reading a connection in its reader's place (``read_for``, ``read_waiting``): the
reply it waits for handled in its own scheduler pass, not a pass later by the woken reader, which
steps aside meanwhile. ``ReadsInPlace`` is that part of ``Connection`` (its state is the
connection's)."""

from __future__ import annotations

import contextvars
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import trio

# Reads in a row, the socket never found empty, before the reading task lets others run.
STREAK = 8

ENDED = object()  # a caller reading in the reader's place met the end of stream


class ReadsInPlace:
    """The reader's place, lent to a caller and handed back."""

    sock: socket.socket
    closed: bool
    pending: dict[int, Any]
    _writing: bool  # the writer task is sending (it may wait for the socket)
    _drained: bool  # the last read emptied the socket: wait for it before reading
    _idle: bool  # the reader waits (for the socket, or for a caller to hand it back)
    _reader_waits: bool  # the reader is in wait_readable
    _kicked: bool  # a caller woke it from there to take its place
    _aside: trio.lowlevel.Task | None  # the reader, waiting while lent
    _lent: bool  # a caller reads in the reader's place
    _handed: Any  # what a caller left the reader: an error or an awaitable
    _context: contextvars.Context  # the reader task's, once it runs
    #: One read into frames to handle (False at the socket's end), and the frames handled:
    #: the connection's.
    _read: Callable[[], bool]
    _take_frames: Callable[[], Awaitable[None] | object | None]

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
                elif streak >= STREAK:  # a peer that keeps the socket full: as the reader does
                    streak = 0
                    await trio.lowlevel.checkpoint()
                streak += 1
                left = self._in_readers_place()
                if left is not None:
                    if left is not ENDED:
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
        if left is not None and left is not ENDED:  # the end: the reader, woken by it, reads it
            self._handed = left
            self._kick_reader()

    def _in_readers_place(self) -> object:
        """One read, and the frames it brought handled, by a caller in the reader's stead and
        in the reader's context (what a handler sets there is not the caller's): None when
        all were handled (or nothing was there); ENDED at the end of stream; otherwise what
        the reader must go on from: the awaitable of a handler that must wait, _HANDED_OVER,
        or the error (a broken frame, a lost connection) it ends the connection with."""
        context = self._context
        try:
            if not context.run(self._read):
                return ENDED
            return context.run(self._take_frames)
        except Exception as exc:
            return exc

    def _kick_reader(self) -> None:
        """Wake the reader from its wait for the socket, at once (it looks for what a caller
        left it, or steps aside while one reads)."""
        self._kicked = True
        trio.lowlevel.notify_closing(self.sock)
