"""A node's incoming frames: calls and casts delivered to this process's actor cells, replies
to the calls this node made, node operations (SYS) run, and the replies this node sends.
``Node`` inherits it; what it uses of the node is declared below.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from .._core._errors import ProtocolError
from .._wire import _codec
from .._wire._connection import Connection
from .._wire._frames import (
    CALL,
    CANCEL,
    CAST,
    ERR,
    HELLO,
    OK,
    PORT,
    REPLIES,
    SYS,
    remote_error,
)
from .._wire._refusals import RefusalLog
from .._wire._tensors import Offer, PendingTensor
from ._calls import CallGroup, ReplyTo
from ._cell import ActorCell
from ._channel import TensorChannel
from ._faults import LinkFaults
from ._porttable import PortTable

log = logging.getLogger("otpmesh.node")

#: Runs a node operation: given the connection it came on (None: this process) and its payload.
SysHandler = Callable[[Connection | None, Any], Awaitable[Any]]


class Incoming:
    """Frames that came to this node, and the replies it sends (a part of ``Node``)."""

    channel: TensorChannel | None
    faults: LinkFaults
    nursery: trio.Nursery | None
    parent: Connection | None
    parent_ops: frozenset[str]
    refusals: RefusalLog
    actors: dict[str, ActorCell]
    exited: dict[str, str]
    sys_inline: dict[str, Callable[[Any], None]]
    sys_handlers: dict[str, SysHandler]
    ports: PortTable
    on_hello: Callable[[Connection, Any], None] | None
    cancel_relayed: Callable[[Connection, Any], None] | None

    if TYPE_CHECKING:  # the node's own (declared here for the type checker only)

        def offer(self, collect: list[int] | None) -> Offer | None: ...

    def dispatch(
        self, conn: Connection, msg: list[Any], pending: Sequence[PendingTensor] = ()
    ) -> Awaitable[None] | None:
        if pending and self.channel is not None:  # large tensors to fetch over the channel first
            return self.channel.deliver_later(conn, msg, list(pending))
        # (A node without a channel, a host agent relaying a reply, passes them on as they came.)
        kind = msg[0]
        if kind != SYS and kind != HELLO and self.faults.partitioned():
            return None  # cut off: calls and replies are lost (supervision messages still flow)
        if kind == OK or kind == ERR:
            entry = conn.pending.pop(msg[1], None)
            if entry is None:
                return None  # the caller gave up (timeout) before the reply came
            group, index = entry
            if kind == OK:
                group.deliver(index, True, msg[2])
            else:
                group.deliver(index, False, remote_error(group.paths[index], msg))
            return None
        if kind == PORT:  # a value for one of this process's ports (_porttable.py)
            self.ports.arrived(conn, msg)
            return None
        if kind == CANCEL:  # the caller gave up on one of its calls on this connection
            if isinstance(msg[2], str):
                self.cancel_local(msg[2], (conn, msg[1]))
            return None
        if kind == REPLIES:  # a host agent's batch (_fanout.py): each as if it came alone
            for reply in msg[1]:
                self.dispatch(conn, reply)
            return None
        if kind == CALL:
            chain = msg[6] if len(msg) == 7 else ()
            if type(chain) is list:
                if not all(type(link) is str for link in chain):
                    raise ProtocolError("a call's chain is a list of actor ids")
                chain = tuple(chain)
            return self.deliver_local(msg[2], msg[3], msg[4], msg[5], (conn, msg[1]), chain)
        if kind == CAST:
            return self.deliver_local(msg[1], msg[2], msg[3], msg[4], None)
        if kind == SYS:
            if msg[2] in self.parent_ops and conn is not self.parent:
                self._refuse_op(conn, msg[1], msg[2])
                return None
            inline = self.sys_inline.get(msg[2])
            if inline is not None:
                inline(msg[3])
            elif self.nursery is not None:
                self.nursery.start_soon(self._run_sys, conn, msg[1], msg[2], msg[3])
            return None
        if self.on_hello is None:
            raise ProtocolError("unexpected HELLO frame")
        self.on_hello(conn, msg[1])
        return None

    def deliver_local(
        self,
        actor_id: str,
        method: str,
        args: Any,
        kwargs: Any,
        reply: ReplyTo | None,
        chain: tuple[str, ...] = (),
    ) -> Awaitable[None] | None:
        if (
            not isinstance(method, str)
            or not isinstance(args, list)
            or not isinstance(kwargs, dict)
            or type(chain) is not tuple
        ):
            raise ProtocolError("call frame needs a method name, an args array and a kwargs map")
        cell = self.actors.get(actor_id)
        if cell is None or not cell.alive:
            if reply is not None:
                why = cell.describe_exit() if cell else self.exited.get(actor_id, "no such actor")
                self.reply_dead(reply, why)
            return None
        if chain and cell.refused(method, chain, reply):
            return None
        if cell.handle_inline(method, args, kwargs, reply):
            return None
        item = (method, args, kwargs, reply, chain)
        send = cell.mailbox(method)
        try:
            send.send_nowait(item)
        except trio.WouldBlock:
            return send.send(item)
        except trio.ClosedResourceError:
            if reply is not None:
                self.reply_dead(reply, cell.describe_exit())
        return None

    def cancel_local(self, actor_id: str, reply: ReplyTo) -> None:
        """A caller gave up on its call to `actor_id`: cancel it there (or, in a host agent,
        in the worker the call was relayed to)."""
        cell = self.actors.get(actor_id)
        if cell is not None:
            cell.cancel(reply)
        elif self.cancel_relayed is not None and not isinstance(reply[0], CallGroup):
            self.cancel_relayed(reply[0], reply[1])

    def _refuse_op(self, conn: Connection, call_id: Any, op: Any) -> None:
        why = f"node operation {op!r} refused: only this process's parent may ask for it"
        self.refusals.refused(f"connection {conn.peer}", why)
        if isinstance(call_id, int) and call_id >= 0:
            self.reply_error((conn, call_id), "ProtocolError", why, "")

    async def _run_sys(self, conn: Connection, call_id: int, op: str, payload: Any) -> None:
        handler = self.sys_handlers.get(op)
        reply: ReplyTo | None = (conn, call_id) if call_id >= 0 else None
        if handler is None:
            self.reply_error(reply, "ProtocolError", f"unknown node operation {op!r}", "")
            return
        try:
            result = await handler(conn, payload)
        except Exception as exc:
            import traceback

            self.reply_error(reply, type(exc).__qualname__, str(exc), traceback.format_exc())
            if reply is None and conn is not None and conn is not self.parent:
                # Any authenticated peer may cast this as often as it likes: rate-limited.
                self.refusals.refused(f"connection {conn.peer}", f"node operation {op}: {exc}")
            elif reply is None:
                log.exception("node operation %s failed", op)
            return
        if reply is not None:
            self.reply_ok(reply, result)

    # ---------------------------------------------------------------- replies

    def reply_ok(self, reply: ReplyTo, value: Any) -> None:
        target, call_id = reply
        local = isinstance(target, CallGroup)
        try:  # same process: no channel needed, no frame to fit in
            if type(value) in _codec.SCALARS:  # nothing to offer the channel, nothing to scan
                payload = _codec.pack_plain([OK, call_id, value])
            else:
                payload = _codec.pack([OK, call_id, value], self.offer(None), local=local)
        except Exception as exc:
            self.reply_error(reply, type(exc).__qualname__, f"cannot send the result: {exc}", "")
            return
        if isinstance(target, CallGroup):
            target.deliver(call_id, True, _codec.unpack(payload)[2])
        elif not target.closed and not self.faults.partitioned():
            target.send_nowait(payload)

    def reply_error(
        self, reply: ReplyTo | None, type_name: str, message: str, tb: str, kind: str = "raised"
    ) -> None:
        if reply is None:
            return
        target, call_id = reply
        msg = [ERR, call_id, kind, type_name, message, tb]
        if isinstance(target, CallGroup):
            target.deliver(call_id, False, remote_error(target.paths[call_id], msg))
        elif not target.closed and not self.faults.partitioned():
            target.send_nowait(_codec.pack(msg))

    def reply_dead(self, reply: ReplyTo, reason: str) -> None:
        self.reply_error(reply, "ActorDiedError", reason, "", kind="dead")
