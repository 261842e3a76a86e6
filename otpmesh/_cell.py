"""An actor's cell: its instance, its bounded mailbox, the task serving one message at a time."""

from __future__ import annotations

import contextvars
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from ._actor import ActorContext, EndpointInfo, set_context

if TYPE_CHECKING:
    from ._node import Node, ReplyTo

log = logging.getLogger("otpmesh.actor")

MAILBOX_CAPACITY = 1024


@dataclass(frozen=True, slots=True)
class ExitReason:
    """Why an actor stopped: 'normal', 'shutdown', or a crash with the exception's type and text."""

    kind: str
    type_name: str = ""
    message: str = ""
    traceback: str = ""

    def describe(self) -> str:
        if self.kind == "crashed":
            return f"crashed with {self.type_name}: {self.message}"
        return self.kind

    def to_data(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "type": self.type_name,
            "message": self.message,
            "traceback": self.traceback,
        }


# A mailbox entry: (endpoint name, args, kwargs, where the reply goes or None for a cast).
Message = tuple[str, list[Any], dict[str, Any], "ReplyTo | None"]


class ActorCell:
    """Hosts one actor instance inside a node."""

    def __init__(
        self,
        node: Node,
        ctx: ActorContext,
        instance: Any,
        endpoints: dict[str, EndpointInfo],
        on_exit: Callable[[ActorCell], None],
        capacity: int = MAILBOX_CAPACITY,
    ) -> None:
        self.node = node
        self.ctx = ctx
        self.instance = instance
        self.endpoints = endpoints
        self._on_exit = on_exit
        self.send, self._receive = trio.open_memory_channel[Message](capacity)
        self.exit_reason: ExitReason | None = None
        self._scope = trio.CancelScope()
        self.busy = False
        # Plain-def endpoints may run in the connection's task; they still see this actor's context.
        self._pyctx = contextvars.copy_context()
        self._pyctx.run(set_context, ctx)

    @property
    def alive(self) -> bool:
        return self.exit_reason is None

    async def run(self) -> None:
        set_context(self.ctx)
        with self._scope:
            while await self._serve_batch():
                pass
        if self.exit_reason is None:
            self.exit_reason = ExitReason("shutdown")
        self._drain()
        self._on_exit(self)

    async def _serve_batch(self) -> bool:
        """Handle what is queued (at least one message); return False when the actor is done."""
        receive = self._receive
        try:
            item = await receive.receive()
        except trio.EndOfChannel:
            return False
        # Drain without a scheduler round trip per message, but yield now and then.
        for _ in range(64):
            self.busy = True
            alive = await self._handle(*item)
            self.busy = False
            if not alive:
                return False
            try:
                item = receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return True
        self.busy = True
        alive = await self._handle(*item)
        self.busy = False
        return alive

    def stop(self, reason: ExitReason) -> None:
        """End the actor after its current message; queued messages get an 'actor died' reply."""
        if self.exit_reason is None:
            self.exit_reason = reason
        self._scope.cancel()

    def _drain(self) -> None:
        self.send.close()
        reason = self.describe_exit()
        while True:
            try:
                _, _, _, reply = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if reply is not None:
                self.node.reply_dead(reply, reason)
        self._receive.close()

    def describe_exit(self) -> str:
        return self.exit_reason.describe() if self.exit_reason else "running"

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
        try:
            result = self._pyctx.run(getattr(self.instance, method), *args, **kwargs)
        except Exception as exc:
            if not self._failed(info, method, exc, reply):
                self._scope.cancel()
            return True
        if reply is not None:
            self.node.reply_ok(reply, result)
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
        try:
            result = getattr(self.instance, method)(*args, **kwargs)
            if info.is_async:
                result = await result
        except Exception as exc:
            return self._failed(info, method, exc, reply)
        if reply is not None:
            self.node.reply_ok(reply, result)
        return True

    def _failed(
        self, info: EndpointInfo, method: str, exc: Exception, reply: ReplyTo | None
    ) -> bool:
        """Report an endpoint's exception; return False when it crashes the actor."""
        tb = "".join(traceback.format_exception(exc))
        # Log before replying, so the log line is on its way before the caller can react.
        if info.let_it_crash:
            log.error("%s crashed in %s:\n%s", self.ctx.path, method, tb)
        elif reply is None:
            log.error("%s: %s raised (cast, actor lives on):\n%s", self.ctx.path, method, tb)
        self.node.reply_error(reply, type(exc).__qualname__, str(exc), tb)
        if not info.let_it_crash:
            return True
        self.exit_reason = ExitReason("crashed", type(exc).__qualname__, str(exc), tb)
        return False
