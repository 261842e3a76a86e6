"""Broadcast as a tree, the host agent's side (the caller's is _fanout.py): a ``fanout`` cast
relayed to the workers on this host, in the order casts came, and their replies sent back to
the caller under its own call ids; replies that reach the agent together travel back together,
in one REPLIES frame. A worker that dies with the call in flight answers ``ERR`` of kind
``lost``: it died after delivery (not safe to resend blindly).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from .._core._errors import ActorDiedError, ActorError
from .._wire import _codec
from .._wire._frames import _ARRAY6, _ARRAY7, _P_CALL, CANCEL, ERR, OK, REPLIES, _pack_uint

if TYPE_CHECKING:
    from .._wire._connection import Connection
    from ._node import Node

log = logging.getLogger("otpmesh.fanout")

#: Cancels remembered for calls not relayed yet (older ones are forgotten).
_CANCELS_REMEMBERED = 1024


class _Forward:
    """Replies of one relayed call: each goes back to the caller under its own call id.

    Quacks like a CallGroup for the node's reply path (``paths``, ``deliver``, ``cancels``)."""

    __slots__ = ("caller", "cancels", "ids", "paths", "relay")

    def __init__(self, relay: Relay, caller: Connection, ids: list[int], paths: list[str]) -> None:
        self.relay, self.caller, self.ids, self.paths = relay, caller, ids, paths
        self.cancels: list[Any] = [None] * len(ids)

    def deliver(self, index: int, ok: bool, value: Any) -> None:
        call_id = self.ids[index]
        self.relay.forwarded.pop((self.caller, call_id), None)
        if ok:
            reply = [OK, call_id, value]
        elif isinstance(value, ActorDiedError):
            kind = "lost" if value.delivered else "dead"
            reply = [ERR, call_id, kind, "ActorDiedError", value.reason, ""]
        elif isinstance(value, ActorError):
            reply = [ERR, call_id, "raised", value.type_name, value.message, value.traceback]
        else:
            reply = [ERR, call_id, "raised", type(value).__qualname__, str(value), ""]
        self.relay.reply(self.caller, reply)

    def send(self, conn: Connection, index: int, body: bytes, chain: list[str]) -> None:
        """Relay the call to the worker behind `conn`; its reply comes back to `deliver`."""
        if self.relay.cancelled_early.pop((self.caller, self.ids[index]), False):
            return  # its caller gave up before it could be relayed
        call_id = conn.expect_reply(self, index)
        actor_id = self.paths[index]
        self.relay.forwarded[(self.caller, self.ids[index])] = (conn, call_id, actor_id)
        head = (_P_CALL, _pack_uint(call_id), _codec.pack(actor_id), body)
        if chain:  # the actors waiting on the call, for the worker's deadlock check
            conn.send_nowait(_ARRAY7, *head, _codec.pack(chain))
        else:
            conn.send_nowait(_ARRAY6, *head)


class Relay:
    """The agent's side: relays ``fanout`` casts to local workers, in the order they came, and
    batches the replies that arrive together into one REPLIES frame per caller.
    ``nursery.start_soon(relay.run)`` once."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._send, self._receive = trio.open_memory_channel["tuple[Connection, Any]"](1024)
        self._out: dict[Connection, list[list[Any]]] = {}
        self._queued = 0  # fanouts waiting in the channel (a worker to dial first)
        # Relayed calls still out: (caller's connection, its call id) -> (the worker's
        # connection, the relayed call id, the actor), so a caller's CANCEL reaches the actor.
        self.forwarded: dict[tuple[Connection, int], tuple[Connection, int, str]] = {}
        # Cancels that came before their call was relayed (it waited for a worker's dial), or
        # after its reply: a bounded memory of recent ones.
        self.cancelled_early: dict[tuple[Connection, Any], bool] = {}
        node.sys_inline["fanout"] = self._enqueue
        node.cancel_relayed = self.cancel
        node.close_hooks.append(self._caller_closed)

    def _caller_closed(self, conn: Connection) -> None:
        """A caller's connection closed (its process died): cancel what it still waits for."""
        for caller, call_id in [key for key in self.forwarded if key[0] is conn]:
            self.cancel(caller, call_id)
        for key in [key for key in self.cancelled_early if key[0] is conn]:
            del self.cancelled_early[key]

    def cancel(self, caller: Connection, call_id: Any) -> None:
        """The caller gave up on a call relayed here: forget its reply, tell the worker."""
        entry = self.forwarded.pop((caller, call_id), None)
        if entry is None:
            if not caller.closed:
                self.cancelled_early[(caller, call_id)] = True
                if len(self.cancelled_early) > _CANCELS_REMEMBERED:
                    del self.cancelled_early[next(iter(self.cancelled_early))]
            return
        conn, relayed_id, actor_id = entry
        conn.pending.pop(relayed_id, None)
        if not conn.closed:
            conn.send_nowait(_codec.pack([CANCEL, relayed_id, actor_id]))

    def _enqueue(self, payload: Any) -> None:
        parent = self.node.parent
        if parent is None:
            return
        if self._queued == 0 and self._relay_now(parent, payload):
            return  # the usual case: every worker already connected, nothing queued before it
        self._queued += 1
        self._send.send_nowait((parent, payload))

    def _relay_now(self, caller: Connection, p: dict[str, Any]) -> bool:
        conns = [self.node.connected(addr) for addr in p["addrs"]]
        if any(conn is None for conn in conns):
            return False
        forward = _Forward(self, caller, p["ids"], p["actors"])
        for index, conn in enumerate(conns):
            assert conn is not None
            forward.send(conn, index, p["body"], p.get("chain") or [])
        return True

    async def run(self) -> None:
        async for caller, p in self._receive:
            await self.relay(
                caller, p["ids"], p["actors"], p["addrs"], p["body"], p.get("chain") or []
            )
            self._queued -= 1

    async def relay(
        self,
        caller: Connection,
        ids: list[int],
        actors: list[str],
        addrs: list[str],
        body: bytes,
        chain: list[str],
    ) -> None:
        forward = _Forward(self, caller, ids, actors)
        for index, (actor_id, addr) in enumerate(zip(actors, addrs, strict=True)):
            try:
                conn = await self.node.connect(addr)
            except OSError as exc:
                why = self.node.unreachable(addr, exc)
                forward.deliver(index, False, ActorDiedError(actor_id, why, delivered=False))
                continue
            forward.send(conn, index, body, chain)

    def reply(self, caller: Connection, reply: list[Any]) -> None:
        """Queue one reply; replies queued in the same scheduler pass go out as one frame."""
        batch = self._out.get(caller)
        if batch is None:
            self._out[caller] = [reply]
            assert self.node.nursery is not None
            self.node.nursery.start_soon(self._flush, caller)
        else:
            batch.append(reply)

    async def _flush(self, caller: Connection) -> None:
        batch = self._out.pop(caller)
        if caller.closed:
            return
        try:
            caller.send_nowait(_codec.pack([REPLIES, batch]))
        except Exception as exc:  # a value the wire cannot carry: say so for that call alone
            for reply in batch:
                try:
                    caller.send_nowait(_codec.pack(reply))
                except Exception:
                    error = [ERR, reply[1], "raised", type(exc).__qualname__, str(exc), ""]
                    caller.send_nowait(_codec.pack(error))
