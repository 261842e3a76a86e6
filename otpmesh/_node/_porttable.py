"""A node's ports: where PORT frames for this process go, and how this process sends them.

A port is named on the wire by its owner's address, an id and a token (``_ports.Port``). The
owner keeps one table: port id -> sink (a ``PortReceiver``'s queue, or the reply of a call to a
``reply_port`` endpoint). The table holds receivers weakly: a receiver nobody holds any more is
gone, and what is sent to it is dropped, like a message to a dead Erlang process. A send whose
token is not the port's is refused (logged once per peer, then summarized) and dropped: a peer
that was never given the port cannot guess it (docs/security.md).

Sends are fire-and-forget and keep their order per sender: a frame goes straight onto the
connection when there is one, and waits (bounded, MAX_UNSENT per address) while the first
connection to that owner is dialed.
"""

from __future__ import annotations

import hmac
import itertools
import secrets
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio

from .._core._errors import ProtocolError
from .._wire import _codec, _payloads
from .._wire._brief import brief
from .._wire._frames import PORT

if TYPE_CHECKING:
    from .._wire._connection import Connection
    from .._wire._refusals import RefusalLog
    from .._wire._tensors import Offer
    from ._channel import TensorChannel
    from ._faults import LinkFaults

#: What a PORT frame carries: a value, the end of the stream, or an error (ERROR_FIELDS).
VALUE, CLOSE, ERROR = 0, 1, 2
#: An error's fields: type name, message, traceback, and the actor (or "controller") that sent it.
ERROR_FIELDS = (_payloads.STR,) * 4
#: A port's token: 128 random bits, so a peer cannot guess one it was not given.
TOKEN_BYTES = 16
#: Frames kept per owner address while its first connection is dialed (more are dropped).
MAX_UNSENT = 1024
#: Port ids are below this (they travel as msgpack uints).
MAX_ID = 1 << 64


#: Where a call's reply goes (``_calls.ReplyTo``: a connection or a local call group, and the
#: call id there); opaque here.
ReplyTo = tuple[Any, int]

_CURRENT: trio.lowlevel.RunVar[PortTable] = trio.lowlevel.RunVar("otpmesh_ports")


def current_table() -> PortTable | None:
    """The port table of this trio run's node (set with it: ``_node.set_current_node``)."""
    try:
        return _CURRENT.get()
    except (LookupError, RuntimeError):  # RuntimeError: not inside a trio run at all
        return None


def set_current_table(table: PortTable) -> None:
    _CURRENT.set(table)


def new_token() -> bytes:
    return secrets.token_bytes(TOKEN_BYTES)


class Sink(Protocol):
    """Where a port's values go, in its owner's process."""

    token: bytes

    def put(self, what: int, value: Any) -> None:
        """One arrival: VALUE with the value, CLOSE, or ERROR with its fields."""


class Replier(Protocol):
    """What answers a call (the node: ``_calls.Replier``)."""

    def reply_ok(self, reply: ReplyTo, value: Any) -> None: ...
    def reply_error(
        self, reply: ReplyTo | None, type_name: str, message: str, tb: str, kind: str = "raised"
    ) -> None: ...


class PortNode(Protocol):
    """What the table uses of its node."""

    addr: str
    tcp_addr: str | None
    nursery: trio.Nursery | None
    faults: LinkFaults
    refusals: RefusalLog
    channel: TensorChannel | None

    def connected(self, addr: str) -> Connection | None: ...
    async def connect(self, addr: str) -> Connection: ...
    def offer(self, collect: list[int] | None) -> Offer | None: ...


@dataclass(frozen=True, slots=True)
class PortTableStatistics:
    """A node's port traffic: ports open here, arrivals delivered, arrivals dropped because
    their receiver is gone, arrivals refused for a wrong token, frames sent, and sends dropped
    here (the owner unreachable, cut off by chaos, or too many waiting for its connection)."""

    open: int
    delivered: int
    gone: int
    forged: int
    sent: int
    unsent: int


class PortTable:
    """The ports of one node, and its sends to ports of others."""

    def __init__(self, node: PortNode) -> None:
        self._node = node
        self._sinks: weakref.WeakValueDictionary[int, Sink] = weakref.WeakValueDictionary()
        self._ids = itertools.count()
        self._unsent: dict[str, list[bytes]] = {}
        self._counts = dict.fromkeys(("delivered", "gone", "forged", "sent", "unsent"), 0)

    def address(self) -> str:
        """Where this node's ports are reached from any process of the app: its TCP address
        when it has one (peers on other hosts), else its Unix socket."""
        return self._node.tcp_addr or self._node.addr

    def register(self, sink: Sink) -> int:
        """A fresh id for `sink` (held weakly: the sink's owner keeps it alive)."""
        port_id = next(self._ids)
        self._sinks[port_id] = sink
        return port_id

    def statistics(self) -> PortTableStatistics:
        return PortTableStatistics(open=len(self._sinks), **self._counts)

    def received(self, port_id: int) -> int | None:
        """How many values the receiver of this node's port `port_id` got so far (None: no
        such receiver here)."""
        count = getattr(self._sinks.get(port_id), "received", None)
        return count if isinstance(count, int) else None

    # ---------------------------------------------------------------- arrivals

    def arrived(self, conn: Connection, msg: list[Any]) -> None:
        """A PORT frame from `conn`: checked field by field (ProtocolError closes `conn`)."""
        _, port_id, token, what, value = msg
        if type(port_id) is not int or not 0 <= port_id < MAX_ID:
            raise ProtocolError(f"bad port id {brief(port_id)}")
        if type(token) is not bytes or len(token) != TOKEN_BYTES:
            raise ProtocolError(f"bad port token {brief(token)}: {TOKEN_BYTES} bytes expected")
        if type(what) is not int or what not in (VALUE, CLOSE, ERROR):
            raise ProtocolError(f"bad port frame kind {brief(what)}")
        if what == ERROR:
            _payloads.fields(value, "port error", ERROR_FIELDS)
        self.deliver(port_id, token, what, value, f"connection {conn.peer}")

    def deliver(self, port_id: int, token: bytes, what: int, value: Any, peer: str) -> None:
        sink = self._sinks.get(port_id)
        if sink is None:
            self._counts["gone"] += 1  # its receiver is gone (or never was): dropped
            return
        if not hmac.compare_digest(sink.token, token):
            self._counts["forged"] += 1
            why = f"a send to port {port_id} with a wrong token (a port it was never given)"
            self._node.refusals.refused(peer, why)
            return
        self._counts["delivered"] += 1
        sink.put(what, value)

    # ---------------------------------------------------------------- sends

    def is_local(self, addr: str) -> bool:
        return addr == self._node.addr or addr == self._node.tcp_addr

    def send(self, addr: str, port_id: int, token: bytes, what: int, value: Any) -> None:
        """Send one arrival to the port (`addr`, `port_id`, `token`); EncodeError if `value`
        cannot travel. Never waits: what cannot go now waits for the connection, bounded."""
        node = self._node
        if self.is_local(addr):  # a copy, as a peer would get: the sender keeps its own
            if what == VALUE:
                value = _codec.unpack(_codec.pack(value, local=True))
            self.deliver(port_id, token, what, value, "this process")
            return
        offered: list[int] = []
        payload = _codec.pack([PORT, port_id, token, what, value], node.offer(offered))
        if offered and node.channel is not None:  # large tensors: released once read
            node.channel.release_after(offered, 1)
        if node.faults.partitioned():
            self._counts["unsent"] += 1
            return
        waiting = self._unsent.get(addr)
        conn = node.connected(addr) if waiting is None else None
        if conn is not None:
            conn.send_nowait(payload)
            self._counts["sent"] += 1
            return
        if waiting is None:
            if node.nursery is None:
                self._counts["unsent"] += 1
                return
            waiting = self._unsent[addr] = []
            node.nursery.start_soon(self._dial, addr)
        if len(waiting) >= MAX_UNSENT:
            self._counts["unsent"] += 1
            return
        waiting.append(payload)

    async def _dial(self, addr: str) -> None:
        conn: Connection | None
        try:
            conn = await self._node.connect(addr)
        except OSError:
            conn = None  # the owner's process is gone: nothing will receive these
        waiting = self._unsent.pop(addr, [])
        if conn is None or conn.closed:
            self._counts["unsent"] += len(waiting)
            return
        for payload in waiting:
            conn.send_nowait(payload)
        self._counts["sent"] += len(waiting)


# -------------------------------------------------------------------- reply ports


class _ReplySink:
    """The reply of one call to a ``reply_port`` endpoint: its first arrival answers the call;
    later ones are dropped (a call has one reply: stream through a Channel port instead)."""

    __slots__ = ("__weakref__", "_owner", "port_id", "reply", "token")

    def __init__(self, owner: ReplyPorts, reply: ReplyTo) -> None:
        self._owner = owner
        self.reply = reply
        self.token = new_token()
        self.port_id = -1

    def put(self, what: int, value: Any) -> None:
        replier = self._owner.replier
        if not self._owner.settle(self):
            return
        if what == VALUE:
            replier.reply_ok(self.reply, value)
        elif what == ERROR:
            type_name, message, tb, _ = value
            replier.reply_error(self.reply, type_name, message, tb)
        else:
            why = "the endpoint's reply port was closed before a value was sent on it"
            replier.reply_error(self.reply, "PortClosedError", why, "")


class ReplyPorts:
    """One actor's reply ports not yet answered. Failed when the actor exits, so that no
    caller waits for a reply that can never come."""

    def __init__(self, table: PortTable, replier: Replier) -> None:
        self.table = table
        self.replier = replier
        self._open: dict[int, _ReplySink] = {}

    def open(self, reply: ReplyTo | None) -> tuple[str, int, bytes]:
        """The (address, id, token) of a new reply port for the call answered at `reply`
        (None, a cast: a port whose arrivals are dropped)."""
        if reply is None:
            return self.table.address(), MAX_ID - 1, new_token()
        sink = _ReplySink(self, reply)
        sink.port_id = self.table.register(sink)
        self._open[sink.port_id] = sink
        return self.table.address(), sink.port_id, sink.token

    def settle(self, sink: _ReplySink) -> bool:
        """Take `sink` out (it is answered); False if it was already."""
        return self._open.pop(sink.port_id, None) is not None

    def forget(self, match: Callable[[ReplyTo], bool]) -> None:
        """Drop the ports of the calls `match` picks (answered already, or their caller gone):
        later sends on them are dropped."""
        for port_id, sink in list(self._open.items()):
            if match(sink.reply):
                del self._open[port_id]

    def fail_all(self, reason: str) -> None:
        """The actor exited: every call still waiting on one of its reply ports fails with
        ActorDiedError (delivered: it ran, so it is not sent again)."""
        sinks, self._open = self._open, {}
        for sink in sinks.values():
            self.replier.reply_error(sink.reply, "ActorDiedError", reason, "", kind="lost")

    def __len__(self) -> int:
        return len(self._open)
