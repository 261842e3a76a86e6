"""Ports and channels: a value that says where values go, and the receiver they arrive at.

``port, receiver = otpmesh.Channel.open()`` in any process that runs an otpmesh node (the
controller inside its app, or an actor). The Port is a value: it travels in messages (wire
extension 16: its owner's address, an id, an unguessable token) and any process of the app that
holds it can ``port.send(value)``; ``await receiver.recv()`` returns the values in the order
each sender sent them. It is Erlang's send to a pid and Monarch's Channel: fire-and-forget,
never blocking the sender. An endpoint declared ``@endpoint(reply_port=True)`` gets a Port for
its caller's reply (``_porttable.ReplyPorts``). docs/guides/ports.md.

What a receiver holds is bounded (its `capacity`): a sender cannot make a receiver that nobody
reads grow without bound. Past it the stream fails: the values already queued are still
returned, then ``recv`` raises PortOverflowError, and what arrives later is dropped.
"""

from __future__ import annotations

import traceback
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import trio

from .._core._actor import current_path
from .._core._errors import ActorError, MeshError, PortClosedError, PortOverflowError
from .._wire import _codec, _payloads
from ._aioloop import bridge
from ._porttable import (
    CLOSE,
    ERROR,
    MAX_ID,
    TOKEN_BYTES,
    VALUE,
    PortTable,
    current_table,
    new_token,
)

T = TypeVar("T")
P = TypeVar("P", bound="Port[Any]")

#: How many unread values a receiver holds by default (an actor's mailbox holds as many).
DEFAULT_CAPACITY = 1024
#: The longest owner address a Port may carry on the wire (real ones are under 100 characters).
MAX_ADDRESS = 512
_PORT_FIELDS = (_payloads.STR, _payloads.INT, _payloads.BYTES)


def _table(what: str) -> PortTable:
    table = current_table()
    if table is None:
        raise MeshError(
            f"{what} needs an otpmesh node in this trio run: call it inside an actor, or in "
            "the controller inside 'async with otpmesh.start(tree)' (or otpmesh.proc_mesh())"
        )
    return table


class Port(Generic[T]):
    """Where values go: a receiver in some process of the app. Send it in messages; anyone
    holding it may ``send`` (and ``close`` or send an ``exception``). Sends never block and
    never fail for what happens at the receiver: a receiver that is gone drops them."""

    __slots__ = ("_addr", "_id", "_token")
    _wire_ext: ClassVar[int] = _codec.EXT_PORT  # how it travels (see _codec)

    def __init__(self, addr: str, port_id: int, token: bytes) -> None:
        self._addr = addr
        self._id = port_id
        self._token = token

    def retyped(self, kind: type[P]) -> P:
        """This port as a `kind`, a subclass that changes what its methods do, not what it is
        (``otpmesh.monarch``'s, whose ``send`` also takes Monarch meshes)."""
        return kind(self._addr, self._id, self._token)

    def send(self, value: T) -> None:
        """Deliver `value` to the receiver (a copy, as in any message); EncodeError here if it
        cannot travel."""
        self._send(VALUE, value, "Port.send")

    def exception(self, exc: BaseException) -> None:
        """Deliver an error: the receiver's ``recv`` raises it as an ActorError carrying its
        type, message and traceback (a call waiting on a reply port raises it)."""
        tb = "".join(traceback.format_exception(exc)) if exc.__traceback__ is not None else ""
        sender = current_path() or "controller"
        self._send(ERROR, [type(exc).__qualname__, str(exc), tb, sender], "Port.exception")

    def close(self) -> None:
        """End the stream: once it has returned what came before, ``recv`` raises
        PortClosedError and ``async for`` ends. Later sends are dropped."""
        self._send(CLOSE, None, "Port.close")

    def _send(self, what: int, value: Any, name: str) -> None:
        aio = bridge()
        if aio is not None:  # an asyncio actor's code: the send itself happens in trio
            if what == VALUE:  # copied now, so the sender may change it at once
                value = _codec.unpack(_codec.pack(value, local=True))
            aio.soon(self._send, what, value, name)
            return
        _table(name).send(self._addr, self._id, self._token, what, value)

    def received_here(self) -> int | None:
        """How many values this port's receiver got so far, when it lives in this process
        (None elsewhere): what ``otpmesh.retry`` reads to never send a stream twice."""
        table = current_table()
        if table is None or not table.is_local(self._addr):
            return None
        return table.received(self._id)

    def _to_wire(self) -> list[Any]:
        return [self._addr, self._id, self._token]

    @classmethod
    def _from_wire(cls, data: Any) -> Port[Any]:
        # Checked before anything is built: ProtocolError for a malformed one (_payloads.py).
        addr, port_id, token = _payloads.fields(data, "port", _PORT_FIELDS)
        problem = None
        if not 0 < len(addr) <= MAX_ADDRESS:
            problem = f"an owner address of {len(addr)} characters (1 to {MAX_ADDRESS})"
        elif not 0 <= port_id < MAX_ID:
            problem = f"port id {port_id} (0 to 2**64-1)"
        elif len(token) != TOKEN_BYTES:
            problem = f"a token of {len(token)} bytes, not {TOKEN_BYTES}"
        if problem is not None:
            raise _payloads.malformed("port", problem)
        return cls(addr, port_id, token)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Port) and (self._addr, self._id) == (other._addr, other._id)

    def __hash__(self) -> int:
        return hash((self._addr, self._id))

    def __repr__(self) -> str:  # never the token: a repr ends up in logs
        return f"Port({self._id} at {self._addr.lstrip(chr(0))!r})"


@dataclass(frozen=True, slots=True)
class PortReceiverStatistics:
    """A receiver's queue: values waiting, its capacity, values received in all, and arrivals
    dropped (past its capacity, or after its stream ended)."""

    queued: int
    capacity: int
    received: int
    dropped: int


class _Inbox:
    """What a receiver holds, and where its port's arrivals go (its node's PortTable holds it
    weakly: it lives as long as its receiver)."""

    __slots__ = ("__weakref__", "capacity", "dropped", "ended", "lot", "queue", "received", "token")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.queue: deque[tuple[bool, Any]] = deque()
        self.ended: Exception | None = None
        self.lot = trio.lowlevel.ParkingLot()
        self.received = 0
        self.dropped = 0
        self.token = new_token()

    def put(self, what: int, value: Any) -> None:
        if self.ended is not None:
            self.dropped += 1
            return
        if what == CLOSE:
            self.ended = PortClosedError("the port was closed by a sender: the stream ended")
        elif len(self.queue) >= self.capacity:
            self.dropped += 1
            self.ended = PortOverflowError(
                f"more than {self.capacity} values arrived unread: the stream failed there "
                "and later values were dropped; read faster, or open the channel with a larger "
                "capacity (otpmesh.Channel.open(capacity=...))"
            )
        elif what == VALUE:
            self.received += 1
            self.queue.append((True, value))
        else:
            type_name, message, tb, sender = value
            self.received += 1
            self.queue.append((False, ActorError(sender, type_name, message, tb)))
        self.lot.unpark_all()


class PortReceiver(Generic[T]):
    """The receiving end of a Channel: ``await recv()``, or ``async for value in receiver``.
    Lives in the process that opened it; drop it (or ``close`` it) and sends to its port are
    dropped. Made by ``Channel.open``."""

    __slots__ = ("_inbox",)

    def __init__(self, inbox: _Inbox) -> None:
        self._inbox = inbox

    async def recv(self) -> T:
        """The next value; raises what a sender sent with ``Port.exception`` (ActorError),
        PortClosedError once the stream was closed, PortOverflowError once it overflowed."""
        aio = bridge()
        if aio is not None:
            return await aio.to_trio(self.recv)
        inbox = self._inbox
        while not inbox.queue:
            if inbox.ended is not None:
                raise inbox.ended
            await inbox.lot.park()
        ok, value = inbox.queue.popleft()
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    def __aiter__(self) -> AsyncIterator[T]:
        return self._values()

    async def _values(self) -> AsyncIterator[T]:
        while True:
            try:
                value = await self.recv()
            except PortClosedError:
                return
            yield value

    def close(self) -> None:
        """Stop receiving: ``recv`` raises PortClosedError once the queued values are read,
        and later sends are dropped."""
        inbox = self._inbox
        if inbox.ended is None:
            inbox.ended = PortClosedError("the receiver was closed")
        inbox.lot.unpark_all()

    def statistics(self) -> PortReceiverStatistics:
        inbox = self._inbox
        return PortReceiverStatistics(
            len(inbox.queue), inbox.capacity, inbox.received, inbox.dropped
        )


class Channel(Generic[T]):
    """Opens a (Port, PortReceiver) pair: ``port, receiver = otpmesh.Channel.open()``."""

    __slots__ = ()

    @staticmethod
    def open(capacity: int = DEFAULT_CAPACITY) -> tuple[Port[T], PortReceiver[T]]:
        """A new port and its receiver, in this process (the controller, or an actor); at
        most `capacity` unread values are held (past it the stream fails: PortOverflowError)."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(
                f"Channel.open(capacity={capacity!r}): capacity is how many unread values the "
                "receiver holds, a positive int"
            )
        aio = bridge()
        if aio is not None:  # an asyncio actor's code: the port is registered in trio
            return aio.call_sync(Channel[T].open, capacity)
        table = _table("Channel.open()")
        inbox = _Inbox(capacity)
        port_id = table.register(inbox)
        return Port(table.address(), port_id, inbox.token), PortReceiver(inbox)
