"""An actor's cell: its instance, its bounded mailbox, the task serving one message at a time
(and the tasks of its concurrent endpoints' calls in flight, in a nursery of its own)."""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from .._core._actor import ASYNCIO, ActorContext, EndpointInfo, runs_on, set_context
from .._core._exits import ActorCrash, describe, ended_by
from .._core._reasons import KILLED
from .._core._signature import bind_error
from . import _chain, _raised
from ._aioloop import ASYNCIO_HINT, asyncio_thread, needs_asyncio
from ._serving import Serving, chaos_wedge

if TYPE_CHECKING:
    from ._calls import Replier, ReplyTo

log = logging.getLogger("otpmesh.actor")

MAILBOX_CAPACITY = 1024

#: Cancels remembered for calls still queued (older ones are forgotten).
_CANCELLED_MEMORY = 1024

# A mailbox entry: (endpoint name, args, kwargs, where the reply goes or None for a cast, the
# actors waiting on it).
Message = tuple[str, list[Any], dict[str, Any], "ReplyTo | None", tuple[str, ...]]


class ActorCell:
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
    ) -> None:
        self.node = node
        self.ctx = ctx
        self.incarnation = incarnation
        self.instance = instance
        self.endpoints = endpoints
        self._on_exit = on_exit
        self._on_exiting = on_exiting
        self._passing = passing  # what goes on through the actor's code (_raised.py)
        self.send, self._receive = trio.open_memory_channel[Message](capacity)
        self.exit_reason: object = None
        self.exited = False
        self.finished = trio.Event()
        self.busy = False
        self._kill_scope = trio.CancelScope()
        self._serve_scope = trio.CancelScope()
        self._idle_scope: trio.CancelScope | None = None
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
        # Calls of concurrent endpoints: a mailbox of their own (a busy serial endpoint does
        # not hold them up), each started in its own task in `_flight_nursery` (opened only
        # for an actor that has such endpoints), so many in flight, each endpoint's bounded.
        self.in_flight: set[Serving] = set()
        self._flight_nursery: trio.Nursery | None = None
        self._limits = {
            name: trio.Semaphore(info.concurrent)
            for name, info in endpoints.items()
            if info.concurrent
        }
        self._flight_send, self._flight_receive = trio.open_memory_channel[Message](capacity)
        self.task: trio.lowlevel.Task | None = None
        self.wedge: tuple[float | None] | None = None  # chaos.wedge: the next endpoint blocks
        # Plain-def endpoints may run in the connection's task; they still see this actor's context.
        self._pyctx = contextvars.copy_context()
        self._pyctx.run(set_context, ctx, self.request_stop, self.progress)
        # An asyncio actor's async code runs in the process's asyncio thread (_aioloop.py).
        self._aio = asyncio_thread() if runs_on(type(instance)) == ASYNCIO else None
        self._token = trio.lowlevel.current_trio_token()

    def mailbox(self, method: str) -> trio.MemorySendChannel[Message]:
        """Where a message for `method` waits its turn: a concurrent endpoint's own mailbox,
        or the serial one."""
        return self._flight_send if method in self._limits else self.send

    @property
    def alive(self) -> bool:
        return self.exit_reason is None

    def servings(self) -> list[Serving]:
        """Every call this actor runs now: the serial one, and concurrent ones in flight."""
        serving = self.serving
        return [*([serving] if serving is not None else []), *self.in_flight]

    def serves(self, serving: Serving) -> bool:
        return serving is self.serving or serving in self.in_flight

    def cancel(self, reply: ReplyTo) -> bool:
        """The caller of the call answered at `reply` gave up: cancel it if this actor is
        serving it (an async endpoint is cancelled through trio; a plain-def one cannot be and
        runs to the end), or skip it when its turn comes. True if this actor was serving it."""
        if self._current is not None and self._current == reply:
            if self._call_scope is not None:
                self._call_scope.cancel()
            return True
        for call in self.in_flight:
            if call.reply == reply:
                call.scope.cancel()
                return True
        self._cancelled[reply] = None
        if len(self._cancelled) > _CANCELLED_MEMORY:
            del self._cancelled[next(iter(self._cancelled))]
        return False

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
        return Serving(info.name, info.is_async, info.progress_deadline or self.progress_deadline)

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

    def caller_gone(self, conn: object) -> None:
        """The connection `conn` closed: an async endpoint serving a call from it is cancelled
        (nobody is left to answer it); its queued calls are skipped in turn (_handle_one)."""
        current = self._current
        if current is not None and current[0] is conn and self._call_scope is not None:
            self._call_scope.cancel()
        for call in self.in_flight:
            if call.reply is not None and call.reply[0] is conn:
                call.scope.cancel()

    def describe_exit(self) -> str:
        return "running" if self.exit_reason is None else describe(self.exit_reason)

    # ---------------------------------------------------------------- stopping

    def request_stop(self, reason: object) -> None:
        """Stop after the current message (run ``on_stop``); queued messages are not handled."""
        if self.exit_reason is None:
            self._set_exit(reason)
            if self._idle_scope is not None:
                self._idle_scope.cancel()

    def crash(self, reason: object) -> None:
        """Exit now with `reason`, interrupting the current message; ``on_stop`` still runs."""
        if self.exit_reason is None:
            self._set_exit(reason)
        self._serve_scope.cancel()

    def kill(self) -> None:
        """Stop at once: cancel whatever the actor is doing, skip ``on_stop``."""
        if self.exit_reason is None:
            self._set_exit(KILLED)
        elif not self.exited:
            self.exit_reason = KILLED
        self._kill_scope.cancel()

    def _set_exit(self, reason: object) -> None:
        # Announced at once (before any reply to the message that caused it), so the supervisor
        # knows an exit is coming while on_stop still runs.
        self.exit_reason = reason
        if self._on_exiting is not None:
            self._on_exiting(self)

    # ---------------------------------------------------------------- serving

    async def run(self) -> None:
        set_context(self.ctx, self.request_stop, self.progress)
        self.task = trio.lowlevel.current_task()
        try:
            with self._kill_scope:
                with self._serve_scope:
                    if self._limits:
                        async with trio.open_nursery() as nursery:
                            self._flight_nursery = nursery
                            nursery.start_soon(self._dispatch_concurrent, nursery)
                            await self._serve()
                            # Stopping: its calls in flight end with it (callers are told).
                            nursery.cancel_scope.cancel()
                    else:
                        await self._serve()
                self._flight_nursery = None
                if self.exit_reason != KILLED:
                    await self._call_on_stop()
        finally:
            self.exited = True
            self._drain()
            self.finished.set()
            self._on_exit(self)

    async def _serve(self) -> None:
        while self.exit_reason is None and await self._serve_batch():
            pass

    async def _call_on_stop(self) -> None:
        try:
            await self._run_async(self.instance.on_stop(self.exit_reason))
        except BaseException as exc:  # the actor ends with its reason either way
            passing, raised = _raised.split(exc, self._passing)
            if raised is not None:
                crash = ActorCrash.of(raised)
                log.error("%s: on_stop raised:\n%s", self.ctx.path, crash.traceback)
            if passing is not None:
                raise passing from None

    async def _serve_batch(self) -> bool:
        """Handle what is queued (at least one message); return False when the actor is done."""
        receive = self._receive
        with trio.CancelScope() as idle:
            self._idle_scope = idle
            try:
                item = await receive.receive()
            except trio.EndOfChannel:
                return False
            finally:
                self._idle_scope = None
        if idle.cancelled_caught:
            return False
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
        if reply is not None:
            if reply in self._cancelled:
                del self._cancelled[reply]
                return True  # its caller gave up while it waited in the mailbox
            if getattr(reply[0], "closed", False):
                return True  # its caller's process is gone: no one is waiting for it
        self.busy = True
        self._current = reply
        # While this message is handled the actor is busy: its calls carry the chain of actors
        # waiting on it, itself included, so a call back into it fails at once (_chain.py).
        token = _chain.CHAIN.set((*chain, self.ctx.path))
        try:
            return await self._handle(method, args, kwargs, reply)
        except BaseException as exc:
            # Killed or crashed from outside mid-message (a Cancelled, or a group of them from a
            # nursery in the endpoint): its caller still gets an answer, which says the call was
            # delivered (it may have had effects: never sent again for it).
            if reply is not None and _raised.split(exc, (trio.Cancelled,))[0] is not None:
                self.node.reply_error(
                    reply, "ActorDiedError", self.describe_exit(), "", kind="lost"
                )
            raise
        finally:
            _chain.CHAIN.reset(token)
            self._current = None
            self.busy = False

    def _drain(self) -> None:
        reason = self.describe_exit()
        for send, receive in (
            (self.send, self._receive),
            (self._flight_send, self._flight_receive),
        ):
            send.close()
            while True:
                try:
                    _, _, _, reply, _ = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                if reply is not None:
                    self.node.reply_dead(reply, reason)
            receive.close()

    def handle_inline(
        self, method: str, args: list[Any], kwargs: dict[str, Any], reply: ReplyTo | None
    ) -> bool:
        """Run a plain-def endpoint at once if the actor is idle with an empty mailbox (no task
        switch on the hot path). Return False when the message must be queued instead."""
        if self.busy or self.exit_reason is not None:
            return False
        if self._receive.statistics().current_buffer_used:
            return False
        info = self.endpoints.get(method)
        if info is None or info.is_async or info.blocking:
            return False
        if self._bad_call(info, args, kwargs, reply):
            return True
        try:
            self._begin(info)
            result = self._pyctx.run(getattr(self.instance, method), *args, **kwargs)
        except Exception as exc:
            if not self._failed(info, method, exc, reply) and self._idle_scope is not None:
                self._idle_scope.cancel()
            return True
        except BaseException as exc:
            self._ended(method, exc, reply)
            if self._idle_scope is not None:
                self._idle_scope.cancel()
            return True
        finally:
            self.serving = None
        if reply is not None:
            self.node.reply_ok(reply, result)
        if not self.alive and self._idle_scope is not None:  # the endpoint called self.stop()
            self._idle_scope.cancel()
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
        if self._bad_call(info, args, kwargs, reply):
            return True
        try:
            serving = self._begin(info)
            if info.blocking:  # not cancelled by its caller: like any plain def, it runs out
                result = await self._run_blocking(getattr(self.instance, method), args, kwargs)
            else:
                result = getattr(self.instance, method)(*args, **kwargs)
            if info.is_async:
                with trio.CancelScope() as scope:
                    self._call_scope = scope
                    try:
                        if self._aio is not None:
                            result = await self._run_async(result, serving)
                        else:
                            result = await result
                    finally:
                        self._call_scope = None
                if scope.cancelled_caught:
                    return True  # its caller gave up and said so: the actor carries on
        except Exception as exc:
            return self._failed(info, method, exc, reply)
        except BaseException as exc:
            return self._ended(method, exc, reply)
        finally:
            self.serving = None
        if reply is not None:
            self.node.reply_ok(reply, result)
        return True

    async def _run_async(self, coro: Any, serving: Serving | None = None) -> Any:
        """Await an async method's coroutine on this actor's loop: here in trio, or as an
        asyncio task (in this actor's context, its stop request made thread-safe), the task
        recorded on `serving` for its stack (_runtime/_stacks.py)."""
        if self._aio is None:
            return await coro
        context = contextvars.copy_context()
        mark = self.progress if serving is None else serving.mark
        context.run(set_context, self.ctx, self._stop_soon, mark)

        def started(task: Any) -> None:
            if serving is not None:
                serving.aio_task = task

        return await self._aio.run(coro, context, started)

    async def _run_blocking(self, fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run a blocking endpoint in a worker thread, in this task's context (the actor's,
        and the call chain, for deadlock refusal); from there ``trio.from_thread.run`` reaches
        this node. A kill or crash abandons the thread: it runs on to its end unseen."""
        serving = self.serving

        def in_thread() -> Any:
            if serving is not None:
                serving.thread = threading.get_ident()
            set_context(self.ctx, self._stop_from_thread, self.progress)
            try:
                return fn(*args, **kwargs)
            finally:
                if serving is not None:
                    serving.thread = None

        return await trio.to_thread.run_sync(in_thread, abandon_on_cancel=True)

    def _stop_from_thread(self, reason: object) -> None:
        """Actor.stop() from a blocking endpoint's thread: the request runs in trio's (before
        the endpoint's return is seen, so the actor stops after it)."""
        trio.from_thread.run_sync(self.request_stop, reason, trio_token=self._token)

    def _stop_soon(self, reason: object) -> None:
        """Actor.stop() from the asyncio thread: the request runs in trio's."""
        self._token.run_sync_soon(self.request_stop, reason)

    async def _dispatch_concurrent(self, nursery: trio.Nursery) -> None:
        """Start the calls of concurrent endpoints in their mailbox's order, each when its
        endpoint has room for one more in flight."""
        async for method, args, kwargs, reply, chain in self._flight_receive:
            if reply is not None:
                if reply in self._cancelled:
                    del self._cancelled[reply]
                    continue  # its caller gave up while it waited in the mailbox
                if getattr(reply[0], "closed", False):
                    continue
            info = self.endpoints[method]
            if self._bad_call(info, args, kwargs, reply):
                continue
            try:
                await self._limits[method].acquire()
            except BaseException:
                if reply is not None:  # the actor ends before this call began
                    self.node.reply_dead(reply, self.describe_exit())
                raise
            await nursery.start(self._serve_concurrent, info, args, kwargs, reply, chain)

    async def _serve_concurrent(
        self,
        info: EndpointInfo,
        args: list[Any],
        kwargs: dict[str, Any],
        reply: ReplyTo | None,
        chain: tuple[str, ...],
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One call of a concurrent endpoint, in its own task: its body runs up to its first
        wait before the actor takes its next message (so bodies start in mailbox order)."""
        serving = self._serving(info)
        serving.reply, serving.task = reply, trio.lowlevel.current_task()
        self.in_flight.add(serving)
        # It keeps no one busy: its calls carry its caller's chain, not this actor (_chain.py).
        _chain.CHAIN.set(chain)
        set_context(self.ctx, self.request_stop, serving.mark)
        try:
            with trio.CancelScope() as serving.scope:
                task_status.started()
                try:
                    coro = getattr(self.instance, info.name)(*args, **kwargs)
                    result = await (coro if self._aio is None else self._run_async(coro, serving))
                except Exception as exc:
                    if not self._failed(info, info.name, exc, reply):
                        self._serve_scope.cancel()  # a crash ends every call in flight
                    return
                except BaseException as exc:
                    if not self._ended(info.name, exc, reply):
                        self._serve_scope.cancel()
                    return
            if serving.scope.cancelled_caught:
                return  # its caller gave up and said so: the actor carries on
            if reply is not None:
                self.node.reply_ok(reply, result)
        except BaseException as exc:
            # Crashed, killed or stopped from outside mid-call: its caller is told, as for a
            # serial call (delivered: it may have had effects).
            if reply is not None and _raised.split(exc, (trio.Cancelled,))[0] is not None:
                self.node.reply_error(
                    reply, "ActorDiedError", self.describe_exit(), "", kind="lost"
                )
            raise
        finally:
            self.in_flight.discard(serving)
            self._limits[info.name].release()

    def _bad_call(
        self, info: EndpointInfo, args: list[Any], kwargs: dict[str, Any], reply: ReplyTo | None
    ) -> bool:
        """True (and answered as the caller's error, the actor untouched) if the arguments do
        not bind to the endpoint: its caller had no signature to check them against."""
        params = info.params
        if params is None or (problem := params.problem(len(args), kwargs)) is None:
            return False
        text = bind_error(self.ctx.path, info.name, params, problem)
        if reply is None:
            log.warning("%s: a cast was dropped: %s", self.ctx.path, text)
        self.node.reply_error(reply, "TypeError", text, "", kind="badcall")
        return True

    def _ended(self, method: str, exc: BaseException, reply: ReplyTo | None) -> bool:
        """A BaseException escaped the endpoint: what belongs to the runtime goes on; what the
        actor's code raised ends this actor, and only it (_raised.py). Returns False."""
        passing, raised = _raised.split(exc, self._passing)
        if raised is not None:
            reason = ended_by(raised, skip_frames=1, endpoint=method)
            if isinstance(reason, ActorCrash):
                log.error("%s crashed in %s:\n%s", self.ctx.path, method, reason.traceback)
            else:
                log.info("%s stopped in %s (%s)", self.ctx.path, method, describe(reason))
            if self.exit_reason is None:
                self._set_exit(reason)
            if passing is None and isinstance(reason, ActorCrash):
                self.node.reply_error(reply, reason.type_name, reason.message, reason.traceback)
            elif passing is None:
                self.node.reply_error(reply, "ActorDiedError", describe(reason), "", kind="lost")
        if passing is not None:
            raise passing  # the caller hears of it from _handle_one
        return False

    def _failed(
        self, info: EndpointInfo, method: str, exc: Exception, reply: ReplyTo | None
    ) -> bool:
        """Report an endpoint's exception; return False when it crashes the actor."""
        if self._aio is None and needs_asyncio(exc):
            exc.add_note(ASYNCIO_HINT)
        # The user's frames only (an asyncio actor's pass through _run_async and the loop's).
        skip = 1 if self._aio is None or not info.is_async else 3
        crash = ActorCrash.of(exc, skip_frames=skip, endpoint=method)
        # Log and announce the exit before replying: the caller must not see the error before
        # the supervisor can know of the crash.
        if info.let_it_crash:
            log.error("%s crashed in %s:\n%s", self.ctx.path, method, crash.traceback)
            if self.exit_reason is None:
                self._set_exit(crash)
        elif reply is None:
            log.error("%s: %s raised (actor lives on):\n%s", self.ctx.path, method, crash.traceback)
        self.node.reply_error(reply, crash.type_name, crash.message, crash.traceback)
        return not info.let_it_crash
