"""Waiting for replies: one CallGroup per logical call, however many actors it went to.

Replies are delivered synchronously by connection readers; the waiting task is parked with
trio's low-level primitives (one reschedule per wake-up, no Event or task per actor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import trio

from .._wire._connection import Connection

if TYPE_CHECKING:
    from ._porttable import PortTable

_MISSING: Any = object()


class Target(Protocol):
    """Where an actor lives: what a call needs to reach it."""

    @property
    def actor_id(self) -> str: ...
    @property
    def addr(self) -> str: ...
    def dead_reason(self) -> str | None: ...


class CallGroup:
    """The outstanding replies of one call to `n` actors, delivered by index."""

    __slots__ = ("_task", "cancels", "conn", "conns", "offered", "paths", "remaining", "results")

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.results: list[Any] = [_MISSING] * len(paths)
        self.remaining = len(paths)
        # Per index: how to forget the outstanding request if the caller gives up.
        self.cancels: list[Any] = [None] * len(paths)
        self._task: trio.lowlevel.Task | None = None
        #: Temporary tensor-channel buffers holding this call's large arguments.
        self.offered: list[int] = []
        #: The one connection all its replies come on, when its caller may wait for them on
        #: the socket itself (``Connection.read_for``); None: the readers deliver them.
        self.conn: Connection | None = None
        #: A wide call's connections, swept once for replies already there (``read_waiting``).
        self.conns: list[Connection] | None = None

    def deliver(self, index: int, ok: bool, value: Any) -> None:
        """Record the reply (value, or exception when not ok) of actor `index`; first one wins."""
        if self.results[index] is not _MISSING:
            return
        self.results[index] = (ok, value)
        self.cancels[index] = None
        self.remaining -= 1
        # The caller waits for all of them (``wait_all``): woken by the last reply only, not
        # once per reply (a broadcast's replies come in several scheduler passes).
        if not self.remaining and self._task is not None:
            task, self._task = self._task, None
            trio.lowlevel.reschedule(task)

    async def _park(self) -> None:
        self._task = trio.lowlevel.current_task()

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def wait_all(self) -> None:
        if self.remaining and self.conn is not None:
            await self.conn.read_for(self.answered)
        elif self.conns is not None:
            for conn in self.conns:
                conn.read_waiting()
        while self.remaining:
            await self._park()

    def answered(self) -> bool:
        return not self.remaining

    def missing(self) -> list[int]:
        return [i for i, r in enumerate(self.results) if r is _MISSING]

    def forget(self) -> None:
        """Drop the requests still outstanding (timeout, cancellation); late replies are ignored.
        Last first: an actor told to cancel a call it is serving has already been told about
        the calls queued behind it (of a pipelined batch), so it never starts them."""
        cancels = self.cancels
        for i in range(len(cancels) - 1, -1, -1):
            cancel = cancels[i]
            if cancel is not None:
                cancels[i] = None
                cancel()

    def outcome(self, index: int) -> Any:
        """The value of actor `index`, or raise its error."""
        ok, value = self.results[index]
        if ok:
            return value
        raise value


#: Where a call's reply goes: the connection it came on (a caller in another process) or the
#: caller's own group (in this process), and the call id there.
ReplyTo = tuple[Connection | CallGroup, int]

#: An actor's mailbox entry: (endpoint name, args, kwargs, where the reply goes or None for a
#: cast, the actors waiting on it).
Message = tuple[str, list[Any], dict[str, Any], ReplyTo | None, tuple[str, ...]]


class Replier(Protocol):
    """What answers calls: how an actor's cell replies through its node (``Node`` is one)."""

    ports: PortTable  # where the reply ports of reply_port endpoints live

    def reply_ok(self, reply: ReplyTo, value: Any) -> None: ...
    def reply_error(
        self, reply: ReplyTo | None, type_name: str, message: str, tb: str, kind: str = "raised"
    ) -> None: ...
    def reply_dead(self, reply: ReplyTo, reason: str) -> None: ...
