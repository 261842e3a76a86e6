"""A node's outgoing side: calls, casts and node operations to other nodes (see _node.py).

``Node`` inherits it; it is apart only to keep each module about one thing. What it uses of the
node is declared below.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import trio

from .._core._errors import ActorDiedError
from .._wire import _codec
from .._wire._connection import Connection
from .._wire._frames import (
    _ARRAY5,
    _ARRAY6,
    _ARRAY7,
    _P_CALL,
    _P_CAST,
    CANCEL,
    SYS,
    _call_body,
    _pack_uint,
    pack_actor_id,
)
from .._wire._tensors import Offer
from . import _chain, _fanout
from ._calls import CallGroup, ReplyTo, Target
from ._channel import TensorChannel
from ._faults import LinkFaults

log = logging.getLogger("otpmesh.node")

#: A call to this many processes or more has its connections swept for replies once its frames
#: are out (``Connection.read_waiting``): writing them took long enough for the first actors
#: to answer. Fewer: the sweep would mostly find nothing (a reply takes tens of microseconds).
_SWEPT = 16


class Outgoing:
    """Calls, casts and node operations from this node (the first half of ``Node``)."""

    addr: str
    inflight: dict[str, int]
    relays: dict[str, Connection]
    faults: LinkFaults
    nursery: trio.Nursery | None
    parent: Connection | None
    sys_handlers: dict[str, Any]
    _conns: dict[str, Connection]
    channel: TensorChannel | None

    def offer(self, collect: list[int] | None) -> Offer | None:
        """What ``pack`` offers large tensors to: this node's channel (the buffer ids go to
        `collect`, for the sender to drop), or None when it has none (they go inline)."""
        if self.channel is None:
            return None
        return functools.partial(self.channel.offer, collect=collect)

    async def connect(self, addr: str) -> Connection:
        raise NotImplementedError

    def cancel_local(self, actor_id: str, reply: ReplyTo) -> None:
        raise NotImplementedError

    def unreachable(self, addr: str, error: OSError | None = None) -> str:
        raise NotImplementedError

    def deliver_local(
        self,
        actor_id: str,
        method: str,
        args: Any,
        kwargs: Any,
        reply: ReplyTo | None,
        chain: tuple[str, ...] = (),
    ) -> Awaitable[None] | None:
        raise NotImplementedError

    async def call(
        self, targets: Sequence[Target], paths: list[str], method: str, args: Any, kwargs: Any
    ) -> CallGroup:
        """Send one call to every target; the returned group collects the replies."""
        chain = _chain.CHAIN.get()
        array, tail = _call_array(chain)
        group = CallGroup(paths)
        group.offered = []  # large tensors: dropped when this call ends
        try:
            body = _call_body(method, args, kwargs, self.offer(group.offered))
            await self._send_call(group, targets, paths, body, chain, array, tail)
        except BaseException:
            # Failed or cancelled part-way: nobody will wait on this group, so undo it here
            # (tell the actors already called, forget the replies, release the tensors).
            self.ended(targets, group)
            raise
        return group

    def call_now(
        self, targets: Sequence[Target], paths: list[str], method: str, args: Any, kwargs: Any
    ) -> CallGroup | None:
        """``call`` to actors in other processes, sent here and now: the call packed once, a
        frame written to each, no coroutine and nothing awaited (the hot path of ``ref.ep(...)``
        and ``mesh.ep.call(...)``). None, with nothing sent, when ``call`` must do it: one of
        them is dead or in this process, its connection is not open yet or has too much queued
        (``call`` waits), host agents would relay the fan-out, or chaos is on this node's
        links."""
        if self.relays and len(targets) >= _fanout.MIN_FANOUT:
            return None
        conns = []
        for target in targets:
            conn = self._ready(target)
            if conn is None:
                return None
            conns.append(conn)
        chain = _chain.CHAIN.get()
        array, tail = _call_array(chain)
        group = CallGroup(paths)
        group.offered = []
        try:
            body = _call_body(method, args, kwargs, self.offer(group.offered))
        except BaseException:  # an argument that cannot be encoded: nothing sent
            self.ended((), group)
            raise
        inflight = self.inflight
        for target in targets:
            inflight[target.actor_id] = inflight.get(target.actor_id, 0) + 1
        try:
            for index, conn in enumerate(conns):
                self._call_remote(conn, group, index, targets[index].actor_id, body, array, tail)
        except BaseException:
            self.ended(targets, group)
            raise
        if len(conns) == 1:
            group.conn = conns[0]  # its caller waits on the socket (``Connection.read_for``)
        elif len(conns) >= _SWEPT:
            group.conns = conns
        return group

    def call_into(
        self, group: CallGroup, index: int, target: Target, method: str, args: Any, kwargs: Any
    ) -> bool:
        """``call_now``'s call, its reply going to entry `index` of a `group` shared with other
        calls (``otpmesh.gather``: one group, one wait for them all); False, with nothing sent,
        when ``call`` must do it. An argument that cannot be encoded raises, nothing sent."""
        conn = self._ready(target)
        if conn is None:
            return False
        self._call_into(conn, group, index, target, method, args, kwargs)
        return True

    def _ready(self, target: Target) -> Connection | None:
        """The open connection a call to `target` can be written on at once, if there is one."""
        conn = self._conns.get(target.addr)
        if (
            conn is None
            or conn.closed
            or conn.backed_up
            or self.faults.links
            or target.addr == self.addr
            or target.dead_reason() is not None
        ):
            return None
        return conn

    def _call_into(
        self,
        conn: Connection,
        group: CallGroup,
        index: int,
        target: Target,
        method: str,
        args: Any,
        kwargs: Any,
    ) -> None:
        chain = _chain.CHAIN.get()
        array, tail = _call_array(chain)
        body = _call_body(method, args, kwargs, self.offer(group.offered))
        actor_id = target.actor_id
        self.inflight[actor_id] = self.inflight.get(actor_id, 0) + 1
        self._call_remote(conn, group, index, actor_id, body, array, tail)

    def ended(self, targets: Sequence[Target], group: CallGroup) -> None:
        """A call to `targets` is over, answered or not: replies still to come are ignored
        (the actors are told the caller gave up), its in-flight counts and tensors dropped."""
        group.forget()
        self.done(targets)
        if group.offered and self.channel is not None:
            self.channel.drop_offered(group.offered)

    async def _send_call(
        self,
        group: CallGroup,
        targets: Sequence[Target],
        paths: list[str],
        body: bytes,
        chain: tuple[str, ...],
        array: bytes,
        tail: list[bytes],
    ) -> None:
        """Send one call's frames to every target (relayed through host agents where that
        pays), then wait while a connection has too much queued."""
        inflight = self.inflight
        relayed: set[int] = set()
        if self.relays and len(targets) >= _fanout.MIN_FANOUT and not self.faults.links:
            for agent, indices in _fanout.plan(self.relays, targets).items():
                request = _fanout.request(agent, group, indices, targets, body, chain)
                self.sys_cast(agent, "fanout", request)
                relayed.update(indices)
        for index, target in enumerate(targets):
            actor_id = target.actor_id
            inflight[actor_id] = inflight.get(actor_id, 0) + 1
            if index in relayed:
                continue
            dead = target.dead_reason()
            if dead is not None:
                group.deliver(index, False, ActorDiedError(paths[index], dead, delivered=False))
                continue
            if target.addr == self.addr:
                self._call_local(group, index, actor_id, body, chain)
                continue
            try:
                conn = await self.connect(target.addr)
            except OSError as exc:
                why = self.unreachable(target.addr, exc)
                error = ActorDiedError(paths[index], why, delivered=False)
                group.deliver(index, False, error)
                continue
            self._call_remote(conn, group, index, actor_id, body, array, tail)
        for target in targets:
            used = self._conns.get(target.addr)
            if used is not None:
                await used.drain()

    def _call_remote(
        self,
        conn: Connection,
        group: CallGroup,
        index: int,
        actor_id: str,
        body: bytes,
        array: bytes,
        tail: list[bytes],
    ) -> None:
        call_id = conn.expect_reply(group, index)
        # A caller that gives up (timeout, cancellation) also tells the actor to stop.
        group.cancels[index] = functools.partial(
            _cancel_remote, conn, call_id, actor_id, group.cancels[index]
        )
        self._send(conn, array, _P_CALL, _pack_uint(call_id), pack_actor_id(actor_id), body, *tail)

    def done(self, targets: Sequence[Target]) -> None:
        """Forget the in-flight counts of a finished call (used for load balancing)."""
        inflight = self.inflight
        for target in targets:
            n = inflight.get(target.actor_id, 0) - 1
            if n > 0:
                inflight[target.actor_id] = n
            else:
                inflight.pop(target.actor_id, None)

    def _call_local(
        self, group: CallGroup, index: int, actor_id: str, body: bytes, chain: tuple[str, ...]
    ) -> None:
        # Same process: still encode and decode, so arguments are copies as they would be remotely.
        method, args, kwargs = self._unpack_local(body)
        group.cancels[index] = functools.partial(self.cancel_local, actor_id, (group, index))
        waiting = self.deliver_local(actor_id, method, args, kwargs, (group, index), chain)
        if waiting is not None and self.nursery is not None:
            self.nursery.start_soon(_await, waiting)

    def _unpack_local(self, body: bytes) -> list[Any]:
        """A call body for an actor of this process, decoded: large tensors this node offered
        are copied back out of its own buffers."""
        unpacked, pending = _codec.unpack_pending(b"\x93" + body)
        if pending and self.channel is not None:
            unpacked = self.channel.fetch_local(unpacked, pending)
        return unpacked  # type: ignore[no-any-return]

    async def cast(self, targets: Sequence[Target], method: str, args: Any, kwargs: Any) -> None:
        """Fire-and-forget to every target, FIFO with later calls from this node."""
        offered: list[int] = []
        body = _call_body(method, args, kwargs, self.offer(offered))
        if offered and self.channel is not None:  # large values: gone once every target read
            self.channel.release_after(offered, len(targets))
        for target in targets:
            if target.addr == self.addr:
                m, a, k = self._unpack_local(body)
                waiting = self.deliver_local(target.actor_id, m, a, k, None)
                if waiting is not None:
                    await waiting
                continue
            try:
                conn = await self.connect(target.addr)
            except OSError:
                log.warning("cast to %s dropped: its process cannot be reached", target.actor_id)
                continue
            self._send(conn, _ARRAY5, _P_CAST, pack_actor_id(target.actor_id), body)

    async def sys_call(self, conn: Connection, op: str, payload: Any, path: str) -> Any:
        """Run node operation `op` on the peer behind `conn` and return its result."""
        if conn.closed:  # its process is gone: say so as a death, like any call to it
            raise ActorDiedError(path, f"its connection is closed ({conn.close_reason})")
        group = CallGroup([path])
        call_id = conn.expect_reply(group, 0)
        try:
            conn.send_nowait(_codec.pack([SYS, call_id, op, payload], self.offer(None)))
            await group.wait_all()
        finally:
            group.forget()
        return group.outcome(0)

    def _send(self, conn: Connection, *parts: bytes) -> None:
        """Send a call or cast frame, unless chaos delays or drops it."""
        faults = self.faults
        if faults.partitioned():
            return
        delay = faults.delay_to(conn.peer) if faults.links else 0.0
        if delay == 0.0:
            conn.send_nowait(*parts)
        elif delay != math.inf and self.nursery is not None:
            self.nursery.start_soon(_send_later, conn, delay, parts)

    async def resolve(self, slot: Any) -> None:
        """Ask the controller where a supervised actor lives now (a ref that came in a message
        and found its old address dead); waits while the actor restarts."""
        local = self.sys_handlers.get("resolve_actor") if self.parent is None else None
        if self.parent is not None:
            found = await self.sys_call(self.parent, "resolve_actor", slot.actor_id, slot.actor_id)
        elif local is not None:  # the controller itself, holding a ref that came in a message
            found = await local(None, slot.actor_id)
        else:
            slot.mark_gone("its supervisor cannot be asked (no controller connection)")
            return
        if found.get("gone") is not None:
            slot.mark_gone(found["gone"])
        else:
            slot.mark_up(found["addr"], None)

    def sys_cast(self, conn: Connection, op: str, payload: Any) -> None:
        self.sys_cast_all([conn], op, payload)

    def sys_cast_all(self, conns: Iterable[Connection], op: str, payload: Any) -> None:
        """``sys_cast`` to each of `conns`, the frame encoded once."""
        frame: bytes | None = None
        for conn in conns:
            if not conn.closed:
                if frame is None:
                    frame = _codec.pack([SYS, -1, op, payload], self.offer(None))
                conn.send_nowait(frame)


def _call_array(chain: tuple[str, ...]) -> tuple[bytes, list[bytes]]:
    """A call frame's array header, and what follows its body: the chain of actors waiting on
    the caller, when it is an actor (the one called refuses a call that would wait on itself)."""
    if chain:
        return _ARRAY7, [_codec.pack(list(chain))]
    return _ARRAY6, []


def _cancel_remote(
    conn: Connection, call_id: int, actor_id: str, forget: Callable[[], None]
) -> None:
    """Forget a call's reply and tell its actor the caller gave up (a CANCEL frame)."""
    forget()
    if not conn.closed:
        conn.send_nowait(_codec.pack([CANCEL, call_id, actor_id]))


async def _send_later(conn: Connection, delay: float, parts: tuple[bytes, ...]) -> None:
    await trio.sleep(delay)
    if not conn.closed:
        conn.send_nowait(*parts)


async def _await(waiting: Awaitable[None]) -> None:
    await waiting
