"""An actor's cell: its instance, its bounded mailbox, the task serving one message at a time."""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from .._core._actor import ASYNCIO, ActorContext, EndpointInfo, runs_on, set_context
from .._core._exits import ActorCrash, describe, ended_by
from .._core._reasons import KILLED
from .._core._signature import bind_error
from . import _chain, _raised
from ._aioloop import ASYNCIO_HINT, asyncio_thread, needs_asyncio
from ._ports import Port
from ._porttable import ReplyPorts
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
        self.task: trio.lowlevel.Task | None = None
        self.wedge: tuple[float | None] | None = None  # chaos.wedge: the next endpoint blocks
        # Plain-def endpoints may run in the connection's task; they still see this actor's context.
        self._pyctx = contextvars.copy_context()
        self._pyctx.run(set_context, ctx, self.request_stop, self.progress)
        # An asyncio actor's async code runs in the process's asyncio thread (_aioloop.py).
        self._aio = asyncio_thread() if runs_on(type(instance)) == ASYNCIO else None
        self._token = trio.lowlevel.current_trio_token()
        # The reply ports of calls to reply_port endpoints not answered yet (_porttable.py).
        self._replies = ReplyPorts(node.ports, node)

    @property
    def alive(self) -> bool:
        return self.exit_reason is None

    def cancel(self, reply: ReplyTo) -> bool:
        """The caller of the call answered at `reply` gave up: cancel it if this actor is
        serving it (an async endpoint is cancelled through trio; a plain-def one cannot be and
        runs to the end), or skip it when its turn comes. True if this actor was serving it."""
        self._replies.forget(lambda r: r == reply)  # its reply port: nobody waits on it any more
        if self._current is not None and self._current == reply:
            if self._call_scope is not None:
                self._call_scope.cancel()
            return True
        self._cancelled[reply] = None
        if len(self._cancelled) > _CANCELLED_MEMORY:
            del self._cancelled[next(iter(self._cancelled))]
        return False

    def progress(self) -> None:
        """otpmesh.progress(): the endpoint running now is still moving."""
        serving = self.serving
        if serving is not None:
            serving.progress_at = time.monotonic()

    def _begin(self, info: EndpointInfo) -> None:
        deadline = info.progress_deadline or self.progress_deadline
        self.serving = Serving(info.name, info.is_async, deadline)
        if self.wedge is not None:
            (seconds,), self.wedge = self.wedge, None
            chaos_wedge(seconds)

    def caller_gone(self, conn: object) -> None:
        """The connection `conn` closed: an async endpoint serving a call from it is cancelled
        (nobody is left to answer it); its queued calls are skipped in turn (_handle_one)."""
        self._replies.forget(lambda reply: reply[0] is conn)
        current = self._current
        if current is not None and current[0] is conn and self._call_scope is not None:
            self._call_scope.cancel()

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
                    while self.exit_reason is None and await self._serve_batch():
                        pass
                if self.exit_reason != KILLED:
                    await self._call_on_stop()
        finally:
            self.exited = True
            self._replies.fail_all(self.describe_exit())
            self._drain()
            self.finished.set()
            self._on_exit(self)

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
        self.send.close()
        reason = self.describe_exit()
        while True:
            try:
                _, _, _, reply, _ = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if reply is not None:
                self.node.reply_dead(reply, reason)
        self._receive.close()

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
        if info is None or info.is_async:
            return False
        if self._bad_call(info, args, kwargs, reply):
            return True
        try:
            self._begin(info)
            if info.reply_port:
                args = [self._reply_port(reply), *args]
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
        if reply is not None and not info.reply_port:
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
            self._begin(info)
            if info.reply_port:
                args = [self._reply_port(reply), *args]
            result = getattr(self.instance, method)(*args, **kwargs)
            if info.is_async:
                with trio.CancelScope() as scope:
                    self._call_scope = scope
                    try:
                        result = await (result if self._aio is None else self._run_async(result))
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
        if reply is not None and not info.reply_port:
            self.node.reply_ok(reply, result)
        return True

    def _reply_port(self, reply: ReplyTo | None) -> Port[Any]:
        """The port a reply_port endpoint replies through (a cast's drops what is sent)."""
        return Port(*self._replies.open(reply))

    async def _run_async(self, coro: Any) -> Any:
        """Await an async method's coroutine on this actor's loop: here in trio, or as an
        asyncio task (in this actor's context, its stop request made thread-safe)."""
        if self._aio is None:
            return await coro
        context = contextvars.copy_context()
        context.run(set_context, self.ctx, self._stop_soon, self.progress)
        return await self._aio.run(coro, context, self._aio_started)

    def _aio_started(self, task: Any) -> None:
        serving = self.serving
        if serving is not None:
            serving.aio_task = task  # read for its stack (_runtime/_stacks.py)

    def _stop_soon(self, reason: object) -> None:
        """Actor.stop() from the asyncio thread: the request runs in trio's."""
        self._token.run_sync_soon(self.request_stop, reason)

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
        if info.reply_port and reply is not None:
            self._replies.forget(lambda r: r == reply)  # answered with the error below
        if info.let_it_crash:
            log.error("%s crashed in %s:\n%s", self.ctx.path, method, crash.traceback)
            if self.exit_reason is None:
                self._set_exit(crash)
        elif reply is None:
            log.error("%s: %s raised (actor lives on):\n%s", self.ctx.path, method, crash.traceback)
        self.node.reply_error(reply, crash.type_name, crash.message, crash.traceback)
        return not info.let_it_crash
