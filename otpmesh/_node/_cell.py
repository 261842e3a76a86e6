"""An actor's cell: its instance, its bounded mailbox, the task serving one message at a time
(and the tasks of its concurrent endpoints' calls in flight, in a nursery of its own)."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from .._core._actor import ASYNCIO, ActorContext, EndpointInfo, runs_on, set_context
from .._core._exits import ActorCrash
from .._core._reasons import KILLED
from . import _chain, _policy, _raised
from ._aioloop import asyncio_thread
from ._blocking import run_blocking
from ._calls import Message
from ._cellcancel import CellCancels
from ._cellstop import CellStopping
from ._flight import Flight
from ._inline import never_suspends
from ._ports import Port
from ._porttable import ReplyPorts
from ._serving import Serving, chaos_wedge

if TYPE_CHECKING:
    from ._calls import Replier, ReplyTo

log = logging.getLogger("otpmesh.actor")

MAILBOX_CAPACITY = 1024


class ActorCell(CellStopping, CellCancels):
    """Hosts one started actor instance inside a node, from its first message to its exit."""

    def __init__(
        self,
        node: Replier,
        ctx: ActorContext,
        incarnation: int,
        instance: Any,
        endpoints: dict[str, EndpointInfo],
        on_exit: Callable[[ActorCell], None],
        on_exiting: Callable[[ActorCell], None] | None = None,
        capacity: int = MAILBOX_CAPACITY,
        progress_deadline: float | None = None,
        passing: tuple[type[BaseException], ...] = _raised.IN_CONTROLLER,
        supervised: bool = True,
    ) -> None:
        self.node = node
        self.supervised = supervised  # a supervisor restarts it (the default error policy)
        self.ctx = ctx
        self.incarnation = incarnation
        self.instance = instance
        self.endpoints = endpoints
        self._on_exit = on_exit
        self._on_exiting = on_exiting
        self.passing = passing  # what goes on through the actor's code (_raised.py)
        self.send, self._receive = trio.open_memory_channel[Message](capacity)
        self.exit_reason: object = None
        self.exited = False
        self.finished = trio.Event()
        self.busy = False
        self._kill_scope = trio.CancelScope()
        self._serve_scope = trio.CancelScope()
        # Waiting for its next message: a stop then closes the mailbox, which ends the wait
        # (no cancel scope per wait: on the hot path that was one per call, see _wake_idle).
        self._idle = False
        # The call being served (where its reply goes), and the scope an async endpoint runs
        # in: a caller that gives up cancels it (cancel()).
        self._current: ReplyTo | None = None
        self._call_scope: trio.CancelScope | None = None
        # Calls cancelled while still queued: skipped when their turn comes (a bounded memory
        # of recent ones; a cancel for a call already answered is forgotten in time).
        self._cancelled: dict[Any, None] = {}
        # Progress deadlines: the child spec's, unless the endpoint has its own. `serving` is
        # what runs now; the task is read for an async endpoint's stack (_runtime/_stacks.py).
        self.progress_deadline = progress_deadline
        self.serving: Serving | None = None
        # Calls of concurrent endpoints, in a mailbox of their own, many in flight (_flight.py).
        self.in_flight = Flight(self, endpoints, capacity)
        self.task: trio.lowlevel.Task | None = None
        self.wedge: tuple[float | None] | None = None  # chaos.wedge: the next endpoint blocks
        # Plain-def endpoints may run in the connection's task; they still see this actor's context.
        self._pyctx = contextvars.copy_context()
        self._pyctx.run(set_context, ctx, self.request_stop, self.progress)
        # An asyncio actor's async code runs in the process's asyncio thread (_aioloop.py).
        self.aio = asyncio_thread() if runs_on(type(instance)) == ASYNCIO else None
        # Async endpoints that cannot suspend run as plain-def ones do (_inline.py).
        self._one_step = frozenset(
            name
            for name, info in endpoints.items()
            if info.is_async and self.aio is None and never_suspends(type(instance), name)
        )
        self._token = trio.lowlevel.current_trio_token()
        # The reply ports of calls to reply_port endpoints not answered yet (_porttable.py).
        self._replies = ReplyPorts(node.ports, node)

    def mailbox(self, method: str) -> trio.MemorySendChannel[Message]:
        """Where a message for `method` waits its turn: a concurrent endpoint's own mailbox,
        or the serial one."""
        return self.in_flight.send if method in self.in_flight.limits else self.send

    @property
    def alive(self) -> bool:
        return self.exit_reason is None

    def servings(self) -> list[Serving]:
        """Every call this actor runs now: the serial one, and concurrent ones in flight."""
        serving = self.serving
        return [*([serving] if serving is not None else []), *self.in_flight]

    def serves(self, serving: Serving) -> bool:
        return serving is self.serving or serving in self.in_flight

    def progress(self) -> None:
        """otpmesh.progress(): the endpoint running now is still moving."""
        serving = self.serving
        if serving is not None:
            serving.mark()

    def _begin(self, info: EndpointInfo) -> Serving:
        serving = self.serving = self._serving(info)
        if self.wedge is not None:
            (seconds,), self.wedge = self.wedge, None
            chaos_wedge(seconds)
        return serving

    def _serving(self, info: EndpointInfo) -> Serving:
        # One that cannot suspend runs on the loop's thread as a plain def does: its stack is
        # that thread's, and a trio cancel would never reach it (the watchdog kills at once).
        is_async = info.is_async and info.name not in self._one_step
        return Serving(info.name, is_async, info.progress_deadline or self.progress_deadline)

    def refused(self, method: str, chain: tuple[str, ...], reply: ReplyTo | None) -> bool:
        """Whether a call from `chain` to `method` would wait on itself, answered so if it
        would (_chain.py): a serial endpoint's, while this actor is one its chain waits on."""
        if self.ctx.path not in chain:
            return False
        info = self.endpoints.get(method)
        if info is not None and info.concurrent:
            return False  # it runs beside whatever keeps the actor busy: re-entrant
        cycle = [*chain[chain.index(self.ctx.path) :], self.ctx.path]
        self.node.reply_error(reply, "DeadlockError", _chain.CYCLE_JOIN.join(cycle), "", "deadlock")
        return True

    # ---------------------------------------------------------------- serving

    async def run(self) -> None:
        set_context(self.ctx, self.request_stop, self.progress)
        self.task = trio.lowlevel.current_task()
        try:
            with self._kill_scope:
                with self._serve_scope:
                    if self.in_flight.limits:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(self.in_flight.serve, nursery)
                            await self._serve()
                            # Stopping: its calls in flight end with it (callers are told).
                            nursery.cancel_scope.cancel()
                    else:
                        await self._serve()
                if self.exit_reason != KILLED:
                    await self._call_on_stop()
        finally:
            self.exited = True
            self._replies.fail_all(self.describe_exit())
            self._drain()
            self.finished.set()
            self._on_exit(self)

    async def _serve(self) -> None:
        while self.exit_reason is None and await self._serve_batch():
            pass

    async def _call_on_stop(self) -> None:
        try:
            await self.run_async(self.instance.on_stop(self.exit_reason))
        except BaseException as exc:  # the actor ends with its reason either way
            passing, raised = _raised.split(exc, self.passing)
            if raised is not None:
                crash = ActorCrash.of(raised)
                log.error("%s: on_stop raised:\n%s", self.ctx.path, crash.traceback)
            if passing is not None:
                raise passing from None

    async def _serve_batch(self) -> bool:
        """Handle what is queued (at least one message); return False when the actor is done."""
        receive = self._receive
        self._idle = True
        try:
            item = await receive.receive()
        except trio.EndOfChannel:  # closed: the actor is done (_wake_idle, or its exit)
            return False
        finally:
            self._idle = False
        # Drain without a scheduler round trip per message, but yield now and then.
        for _ in range(64):
            if not await self._handle_one(*item) or self.exit_reason is not None:
                return False
            try:
                item = receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return True
        return await self._handle_one(*item)

    async def _handle_one(
        self,
        method: str,
        args: list[Any],
        kwargs: dict[str, Any],
        reply: ReplyTo | None,
        chain: tuple[str, ...],
    ) -> bool:
        if self.skipped(reply):
            return True
        self.busy = True
        self._current = reply
        # While this message is handled the actor is busy: its calls carry the chain of actors
        # waiting on it, itself included, so a call back into it fails at once (_chain.py).
        token = _chain.CHAIN.set((*chain, self.ctx.path))
        try:
            return await self._handle(method, args, kwargs, reply)
        except BaseException as exc:
            _policy.interrupted(self, exc, reply)  # killed or crashed from outside
            raise
        finally:
            _chain.CHAIN.reset(token)
            self._current = None
            self.busy = False

    def handle_inline(
        self, method: str, args: list[Any], kwargs: dict[str, Any], reply: ReplyTo | None
    ) -> bool:
        """Run a plain-def endpoint (or an async one that cannot suspend) at once if the actor
        is idle with an empty mailbox (no task switch on the hot path). Return False when the
        message must be queued instead."""
        if self.busy or self.exit_reason is not None:
            return False
        mailbox = self._receive.statistics()
        if mailbox.current_buffer_used or (self._idle and not mailbox.tasks_waiting_receive):
            # Queued, or handed to the actor's task (idle, no longer waiting) and not begun
            # yet: a call run here would overtake it (calls sent together arrive together).
            return False
        info = self.endpoints.get(method)
        if info is None or info.blocking or (info.is_async and method not in self._one_step):
            return False
        if _policy.bad_call(self, info, args, kwargs, reply):
            return True
        try:
            self._begin(info)
            if info.reply_port:
                args = [self._reply_port(reply), *args]
            if info.is_async:  # its one step, here (a coroutine without its own frame between)
                try:
                    self._pyctx.run(getattr(self.instance, method)(*args, **kwargs).send, None)
                except StopIteration as done:
                    result = done.value
                else:  # pragma: no cover - never_suspends said it cannot
                    raise RuntimeError(f"{method} suspended although its code has no await")
            else:
                result = self._pyctx.run(getattr(self.instance, method), *args, **kwargs)
        except Exception as exc:
            if not _policy.failed(self, info, method, exc, reply):
                self._wake_idle()
            return True
        except BaseException as exc:
            _policy.ended(self, method, exc, reply)
            self._wake_idle()
            return True
        finally:
            self.serving = None
        if reply is not None and not info.reply_port:
            self.node.reply_ok(reply, result)
        if not self.alive:  # the endpoint called self.stop()
            self._wake_idle()
        return True

    async def _handle(
        self, method: str, args: list[Any], kwargs: dict[str, Any], reply: ReplyTo | None
    ) -> bool:
        """Run one message; return False when the actor crashed."""
        info = self.endpoints.get(method)
        if info is None:
            known = ", ".join(sorted(self.endpoints)) or "none"
            cls = type(self.instance).__qualname__
            self.node.reply_error(
                reply,
                "AttributeError",
                f"{cls} has no endpoint {method!r} (endpoints: {known})",
                "",
            )
            return True
        if _policy.bad_call(self, info, args, kwargs, reply):
            return True
        try:
            serving = self._begin(info)
            if info.reply_port:
                args = [self._reply_port(reply), *args]
            if info.blocking:  # not cancelled by its caller: like any plain def, it runs out
                fn = getattr(self.instance, method)
                result = await run_blocking(self.ctx, serving, self.request_stop, fn, args, kwargs)
            else:
                result = getattr(self.instance, method)(*args, **kwargs)
            if method in self._one_step:
                result = await result  # it cannot suspend (_inline.py): nothing to cancel
            elif info.is_async:
                with trio.CancelScope() as scope:
                    self._call_scope = scope
                    try:
                        if self.aio is not None:
                            result = await self.run_async(result, serving)
                        else:
                            result = await result
                    finally:
                        self._call_scope = None
                if scope.cancelled_caught:
                    return True  # its caller gave up and said so: the actor carries on
        except Exception as exc:
            return _policy.failed(self, info, method, exc, reply)
        except BaseException as exc:
            return _policy.ended(self, method, exc, reply)
        finally:
            self.serving = None
        if reply is not None and not info.reply_port:
            self.node.reply_ok(reply, result)
        return True

    def _reply_port(self, reply: ReplyTo | None) -> Port[Any]:
        """The port a reply_port endpoint replies through (a cast's drops what is sent)."""
        return Port(*self._replies.open(reply))

    def start_async(
        self,
        info: EndpointInfo,
        args: list[Any],
        kwargs: dict[str, Any],
        serving: Serving,
        reply: ReplyTo | None,
    ) -> Any:
        """Call async endpoint `info`: its coroutine, or, in an asyncio actor, the wait for
        its asyncio task (recorded on `serving`)."""
        if info.reply_port:
            args = [self._reply_port(reply), *args]
        coro = getattr(self.instance, info.name)(*args, **kwargs)
        return coro if self.aio is None else self.run_async(coro, serving)

    async def run_async(self, coro: Any, serving: Serving | None = None) -> Any:
        """Await an async method's coroutine on this actor's loop: here in trio, or as an
        asyncio task (in this actor's context, its stop request made thread-safe), the task
        recorded on `serving` for its stack (_runtime/_stacks.py)."""
        if self.aio is None:
            return await coro
        context = contextvars.copy_context()
        mark = self.progress if serving is None else serving.mark
        context.run(set_context, self.ctx, self._stop_soon, mark)

        def started(task: Any) -> None:
            if serving is not None:
                serving.aio_task = task

        return await self.aio.run(coro, context, started)

    def _stop_soon(self, reason: object) -> None:
        """Actor.stop() from the asyncio thread: the request runs in trio's."""
        self._token.run_sync_soon(self.request_stop, reason)
