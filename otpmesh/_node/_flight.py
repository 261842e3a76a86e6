"""The calls of an actor's concurrent endpoints (``@endpoint(concurrent=True)``) in flight.

They have a mailbox of their own, so a serial endpoint that is busy (waiting on a call that
leads back here: re-entrant ping-pong) does not hold them up. One task takes them in that
mailbox's order and starts each in a task of its own, in the actor's nursery: its body runs
up to its first wait before the next one starts, and each endpoint has a bound on its calls in
flight (past it, the mailbox waits). Each call is a ``Serving`` of its own: its own progress
deadline, its own stack, its own cancel scope (a caller that gives up cancels its call only).
A crash in one ends the actor, and the actor's end cancels them all (docs/guides/endpoints.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import trio

from .._core._actor import EndpointInfo, set_context
from . import _chain, _policy
from ._calls import Message
from ._serving import Serving

if TYPE_CHECKING:
    from ._calls import Replier, ReplyTo


def drain(
    send: trio.MemorySendChannel[Message],
    receive: trio.MemoryReceiveChannel[Message],
    node: Replier,
    reason: str,
) -> None:
    """Close a mailbox whose actor ended; answer the calls still in it: dead for `reason`."""
    send.close()
    while True:
        try:
            _, _, _, reply, _ = receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            break
        if reply is not None:
            node.reply_dead(reply, reason)
    receive.close()


class Cell(_policy.Cell, Protocol):
    """What the calls in flight need of their actor's cell (_cell.py's ActorCell)."""

    endpoints: dict[str, EndpointInfo]
    progress_deadline: float | None

    def request_stop(self, reason: object) -> None: ...
    def skipped(self, reply: ReplyTo | None) -> bool: ...
    def end_calls(self) -> None: ...
    def start_async(
        self,
        info: EndpointInfo,
        args: list[Any],
        kwargs: dict[str, Any],
        serving: Serving,
        reply: ReplyTo | None,
    ) -> Any: ...


class Flight:
    """One actor's concurrent calls: their mailbox, the calls in flight, each endpoint's bound."""

    def __init__(self, cell: Cell, endpoints: dict[str, EndpointInfo], capacity: int) -> None:
        self._cell = cell
        self.limits = {
            name: trio.Semaphore(info.concurrent)
            for name, info in endpoints.items()
            if info.concurrent
        }
        self.send, self._receive = trio.open_memory_channel[Message](capacity)
        self.calls: set[Serving] = set()

    def __iter__(self) -> Iterator[Serving]:
        return iter(self.calls)

    def __contains__(self, serving: object) -> bool:
        return serving in self.calls

    def cancel(self, reply: ReplyTo) -> bool:
        """Cancel the call answered at `reply` if it is in flight (its caller gave up)."""
        for call in self.calls:
            if call.reply == reply:
                call.scope.cancel()
                return True
        return False

    def caller_gone(self, conn: object) -> None:
        """The connection `conn` closed: its calls in flight are cancelled."""
        for call in self.calls:
            if call.reply is not None and call.reply[0] is conn:
                call.scope.cancel()

    def drain(self, reason: str) -> None:
        """The actor ended: calls still waiting in the mailbox are answered `reason`."""
        drain(self.send, self._receive, self._cell.node, reason)

    async def serve(self, nursery: trio.Nursery) -> None:
        """Start the calls in their mailbox's order, each when its endpoint has room."""
        cell = self._cell
        async for method, args, kwargs, reply, chain in self._receive:
            info = cell.endpoints[method]
            if cell.skipped(reply) or _policy.bad_call(cell, info, args, kwargs, reply):
                continue
            try:
                await self.limits[method].acquire()
            except BaseException:
                if reply is not None:  # the actor ends before this call began
                    cell.node.reply_dead(reply, cell.describe_exit())
                raise
            await nursery.start(self._run, info, args, kwargs, reply, chain)

    async def _run(
        self,
        info: EndpointInfo,
        args: list[Any],
        kwargs: dict[str, Any],
        reply: ReplyTo | None,
        chain: tuple[str, ...],
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        cell = self._cell
        serving = Serving(info.name, True, info.progress_deadline or cell.progress_deadline)
        serving.reply, serving.task = reply, trio.lowlevel.current_task()
        self.calls.add(serving)
        # It keeps no one busy: its calls carry its caller's chain, not this actor (_chain.py).
        _chain.CHAIN.set(chain)
        set_context(cell.ctx, cell.request_stop, serving.mark)  # progress() marks this call
        try:
            with trio.CancelScope() as serving.scope:
                task_status.started()
                try:
                    result = await cell.start_async(info, args, kwargs, serving, reply)
                except Exception as exc:
                    if not _policy.failed(cell, info, info.name, exc, reply):
                        cell.end_calls()  # a crash ends every call in flight
                    return
                except BaseException as exc:
                    if not _policy.ended(cell, info.name, exc, reply):
                        cell.end_calls()
                    return
            if serving.scope.cancelled_caught:
                return  # its caller gave up and said so: the actor carries on
            if reply is not None and not info.reply_port:
                cell.node.reply_ok(reply, result)
        except BaseException as exc:
            _policy.interrupted(cell, exc, reply)  # crashed, stopped or killed from outside
            raise
        finally:
            self.calls.discard(serving)
            self.limits[info.name].release()
