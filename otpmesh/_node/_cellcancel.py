"""A caller giving up on its call (``ActorCell.cancel``, ``caller_gone``): the call cancelled if
the actor serves it now, skipped when its turn comes if it is still queued, and its reply port
forgotten. ``CellCancels`` is that part of ``ActorCell`` (_cell.py; its state is the cell's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from ._flight import Flight
from ._porttable import ReplyPorts

if TYPE_CHECKING:
    from ._calls import ReplyTo

#: Cancels remembered for calls still queued (older ones are forgotten).
CANCELLED_MEMORY = 1024


class CellCancels:
    """Which calls of an actor their callers gave up on."""

    in_flight: Flight
    _replies: ReplyPorts
    _current: ReplyTo | None  # the call being served
    _call_scope: trio.CancelScope | None  # the scope its async endpoint runs in
    _cancelled: dict[Any, None]  # calls cancelled while queued, skipped in turn

    def cancel(self, reply: ReplyTo) -> bool:
        """The caller of the call answered at `reply` gave up: cancel it if this actor is
        serving it (an async endpoint is cancelled through trio; a plain-def one cannot be and
        runs to the end), or skip it when its turn comes. True if this actor was serving it."""
        self._replies.forget(lambda r: r == reply)  # its reply port: nobody waits on it any more
        if self._current is not None and self._current == reply:
            if self._call_scope is not None:
                self._call_scope.cancel()
            return True
        if self.in_flight.cancel(reply):
            return True
        self._cancelled[reply] = None
        if len(self._cancelled) > CANCELLED_MEMORY:
            del self._cancelled[next(iter(self._cancelled))]
        return False

    def caller_gone(self, conn: object) -> None:
        """The connection `conn` closed: an async endpoint serving a call from it is cancelled
        (nobody is left to answer it); its queued calls are skipped in turn (_handle_one)."""
        self._replies.forget(lambda reply: reply[0] is conn)
        current = self._current
        if current is not None and current[0] is conn and self._call_scope is not None:
            self._call_scope.cancel()
        self.in_flight.caller_gone(conn)

    def skipped(self, reply: ReplyTo | None) -> bool:
        """Whether the call answered at `reply`, its turn come, is skipped: its caller gave up
        while it waited in the mailbox, or its caller's process is gone."""
        if reply is None:
            return False
        if reply in self._cancelled:
            del self._cancelled[reply]
            return True
        return bool(getattr(reply[0], "closed", False))

    def forget_port(self, reply: ReplyTo) -> None:
        """The call answered at `reply` is answered with an error: its reply port is closed."""
        self._replies.forget(lambda r: r == reply)
