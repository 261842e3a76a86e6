"""A node: one process's endpoint on the wire (the controller and every worker run one).

It listens on an abstract Unix socket, dials peers directly (actor-to-actor calls never relay
through the controller), routes incoming calls to local actor cells and replies to callers.
Every connection, in or out, proves it belongs to the app before its first frame
(_wire/_handshake.py); docs/security.md has the threat model. The node is made of parts, one
module each: admitting incoming connections (_admission.py), incoming frames and replies
(_incoming.py), and calls to other nodes (_outgoing.py); this module holds its state and its
connections.

Frames are described in _frames.py and docs/wire.md.
"""

from __future__ import annotations

import copy
import errno
import logging
import weakref
from collections.abc import Callable
from typing import Any

import trio

from .._core._errors import ActorDiedError
from .._wire import _secret
from .._wire._accepting import Acceptor
from .._wire._addresses import bind, listen_address, tcp_address
from .._wire._connection import Connection
from .._wire._frames import decode_frame
from .._wire._handshake import dial
from .._wire._refusals import RefusalLog
from .._wire._unproven import Unproven
from ._admission import Admission
from ._cell import ActorCell
from ._channel import TensorChannel
from ._faults import LinkFaults
from ._incoming import Incoming, SysHandler
from ._outgoing import Outgoing
from ._porttable import PortTable, set_current_table

log = logging.getLogger("otpmesh.node")

_CURRENT: trio.lowlevel.RunVar[Node] = trio.lowlevel.RunVar("otpmesh_node")


#: How many dying processes' addresses a node remembers (each is a fresh address, never reused).
DYING_KEPT = 4096


def current_node() -> Node | None:
    """The node of this trio run (a worker's, or the controller's once started), if any."""
    try:
        return _CURRENT.get()
    except (LookupError, RuntimeError):  # RuntimeError: not inside a trio run at all
        return None


def set_current_node(node: Node) -> None:
    _CURRENT.set(node)
    set_current_table(node.ports)  # what Port and Channel use (_ports.py)


class Node(Admission, Incoming, Outgoing):
    """The wire endpoint of one process. Create it, then ``await nursery.start(node.serve)``."""

    def __init__(
        self,
        role: str,
        sys_handlers: dict[str, SysHandler] | None = None,
        *,
        listen: str | None = None,
        secret: bytes | None = None,
        tcp_secret: bytes | None = None,
        channel: Callable[[Node], TensorChannel] | None = None,
        is_app_process: Callable[[int], bool] | None = None,
    ) -> None:
        #: The app's secret: every Unix connection, in or out, proves it knows it (a node made
        #: without one gets a fresh secret nobody else knows).
        self.secret = secret if secret is not None else _secret.new_app_secret()
        #: The cluster's secret, for TCP connections (None: this node speaks Unix only).
        self.tcp_secret = tcp_secret
        #: Node operations accepted only on the connection from this node's parent (its
        #: controller or host agent): never from another actor's connection.
        self.parent_ops: frozenset[str] = frozenset()
        self.refusals = RefusalLog(log)
        #: Whether the process with this pid (a Unix peer's, ``SO_PEERCRED``) is one of the
        #: app's own: passed in by the process that runs the node (the controller knows its
        #: workers); its connections take no slot among the unproven, so strangers cannot
        #: starve them. None: every peer is a stranger until it proves itself.
        self.is_app_process = is_app_process
        #: Incoming connections still proving themselves, per listener (Unix, TCP).
        self.unproven = {False: Unproven(), True: Unproven()}
        #: Proven connections on the Unix socket, per peer process ("pid N"), and how many of
        #: them are held by processes that are not the app's own.
        self.proven: dict[str, int] = {}
        self.proven_strangers = 0
        #: The accept loops, per listener: their ``episodes`` count descriptor shortages.
        self.acceptors: dict[bool, Acceptor] = {}
        self._listener = bind(role, listen)
        self.addr = listen_address(self._listener)
        #: This node's TCP address once ``listen_tcp`` made one (or `listen` asked for TCP).
        self.tcp_addr: str | None = self.addr if listen else None
        self._tcp_scope: trio.CancelScope | None = None
        self.actors: dict[str, ActorCell] = {}
        self.exited: dict[str, str] = {}  # actor id -> why it stopped, for fast failures
        self.last_exit: dict[str, tuple[int, object]] = {}  # id -> (incarnation, reason)
        # Node operations run inline by the connection reader (casts whose order matters).
        self.sys_inline: dict[str, Callable[[Any], None]] = {}
        self.sys_handlers = sys_handlers or {}
        self.on_hello: Callable[[Connection, Any], None] | None = None
        # Returns True when it takes over failing the connection's pending calls.
        self.on_connection_lost: Callable[[Connection], bool] | None = None
        self._conns: dict[str, Connection] = {}
        self._side: dict[str, Connection] = {}
        self._dialing: dict[str, trio.Event] = {}
        self._side_dialing: dict[str, trio.Event] = {}
        self._side_failed: weakref.WeakKeyDictionary[trio.Event, OSError] = (
            weakref.WeakKeyDictionary()
        )  # a failed dial's error, for those who waited on it
        self.nursery: trio.Nursery | None = None
        self.parent: Connection | None = None  # a worker's controller connection
        self.close_hooks: list[Callable[[Connection], None]] = []  # e.g. release RDMA pins
        self.faults = LinkFaults()  # what otpmesh.chaos did to this node's links
        self.inflight: dict[str, int] = {}  # actor id -> calls this node is waiting on
        #: Worker address -> its host agent's connection: broadcasts go through it (_fanout.py).
        self.relays: dict[str, Connection] = {}
        # A host agent's relay: cancels a relayed call in its worker (_fanout.Relay.cancel).
        self.cancel_relayed: Callable[[Connection, Any], None] | None = None
        #: This node's tensor channel (otpmesh.rdma's, passed in by the process that runs the
        #: node); None: large tensors travel inline.
        self.channel: TensorChannel | None = channel(self) if channel is not None else None
        #: This process's ports (otpmesh.Channel) and its sends to others' (_porttable.py).
        self.ports = PortTable(self)
        #: Processes said to be dying (``peer_dying``), by address, the newest DYING_KEPT: how
        #: each died, in the controller's words (None where it did not know yet).
        self.dying: dict[str, str | None] = {}

    # ---------------------------------------------------------------- serving

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                task_status.started()
                await self._accept_loop(self._listener)
        finally:
            self.nursery = None  # closed: nothing may start in it any more

    async def run_connection(self, conn: Connection) -> None:
        conn.refusals = self.refusals  # a peer's broken frames: logged once, then summarized
        try:
            await conn.run()
        finally:
            self._connection_closed(conn)

    async def connect(self, addr: str) -> Connection:
        """The connection to the node at `addr`, dialing it the first time."""
        conn = self.connected(addr)
        if conn is not None:
            return conn
        while addr in self._dialing:
            await self._dialing[addr].wait()
            conn = self.connected(addr)
            if conn is not None:
                return conn
        self._dialing[addr] = done = trio.Event()
        try:
            return await self._open(addr, self._conns)
        finally:
            del self._dialing[addr]
            done.set()

    def connected(self, addr: str) -> Connection | None:
        """The open connection to the node at `addr`, if there is one already."""
        conn = self._conns.get(addr)
        return conn if conn is not None and not conn.closed else None

    async def connect_side(self, addr: str) -> Connection:
        """A second connection to `addr`, for the tensor channel's own requests. It must not share
        the call connection: that one's reader may be waiting for a transfer these requests make.
        Concurrent first transfers to one owner share one dial (no extra connections)."""
        while True:
            conn = self._side.get(addr)
            if conn is not None and not conn.closed:
                return conn
            dialing = self._side_dialing.get(addr)
            if dialing is None:
                break
            await dialing.wait()  # then use its connection, or share its failure
            failed = self._side_failed.get(dialing)
            if failed is not None:
                raise copy.copy(failed) from failed  # each waiter's own, same type and words
        self._side_dialing[addr] = done = trio.Event()
        try:
            return await self._open(addr, self._side)
        except OSError as exc:  # those who waited on this dial fail with it, not dial again
            self._side_failed[done] = exc
            raise
        finally:
            del self._side_dialing[addr]
            done.set()

    async def _open(self, addr: str, table: dict[str, Connection]) -> Connection:
        """Dial `addr`, keep the connection in `table` and serve it until it closes."""
        if self.nursery is None:
            raise RuntimeError("node is not serving")
        if addr in self.dying:  # its listener may be open still, with nobody to accept
            raise ConnectionRefusedError(errno.ECONNREFUSED, self.unreachable(addr))
        sock, mac = await dial(addr, self.secret_for(addr))
        conn = Connection(sock, peer=addr, decode=decode_frame, on_message=self.dispatch, mac=mac)
        table[addr] = conn
        self.nursery.start_soon(self.run_connection, conn)
        return conn

    def secret_for(self, addr: str) -> bytes | None:
        """The secret a connection to `addr` authenticates with: the cluster's over TCP, the
        app's on a Unix socket."""
        return self.tcp_secret if tcp_address(addr) is not None else self.secret

    def register(self, addr: str, conn: Connection) -> None:
        """Use the (already served) incoming `conn` for calls to the node at `addr`."""
        conn.peer = addr
        self._conns[addr] = conn

    def peer_dying(self, news: Any) -> None:
        """The process at ``news["addr"]`` is dying (``news["reason"]``: how, in the words its
        controller uses, where it knew): its controller heard it from its death lock, while
        the kernel still tears it down and its sockets stay open (``_runtime/_deathlock.py``).
        Nothing more is written to it: the connection leaves the table (a new call finds none,
        is refused as unreachable and, to a supervised actor, resolves the new incarnation) and
        ends after what the process sent before it died (``Connection.finish``), the calls
        still out on it failing as at its end of stream, with that reason."""
        addr = news.get("addr") if type(news) is dict else None
        if type(addr) is not str:
            return
        reason = news.get("reason")
        self.dying[addr] = reason if type(reason) is str else None
        if len(self.dying) > DYING_KEPT:
            del self.dying[next(iter(self.dying))]
        for table in (self._conns, self._side):
            conn = table.pop(addr, None)
            if conn is not None:
                conn.finish()

    def _connection_closed(self, conn: Connection) -> None:
        if self._conns.get(conn.peer) is conn:
            del self._conns[conn.peer]
        if self._side.get(conn.peer) is conn:
            del self._side[conn.peer]
        for hook in self.close_hooks:
            hook(conn)
        for cell in list(self.actors.values()):
            cell.caller_gone(conn)
        if self.on_connection_lost is None or not self.on_connection_lost(conn):
            self.fail_pending(conn, self.lost_reason(conn))

    def unreachable(self, addr: str, error: OSError | None = None) -> str:
        """Why the process at `addr` cannot be called, for the caller's ActorDiedError: how it
        died, where its controller said, else the dial's `error`. Never its address: that is an
        internal name (an abstract socket's), of no use to whoever reads the error."""
        if addr in self.dying:
            return self.dying[addr] or "its process is dying"
        if error is None:
            return "its process cannot be reached"
        return f"its process cannot be reached ({error.strerror or type(error).__name__})"

    def lost_reason(self, conn: Connection) -> str:
        """Why the calls still out on `conn` failed when it ended: how its process died, where
        its controller said, else how the connection ended."""
        return self.dying.get(conn.peer) or (
            f"its connection closed ({conn.close_reason or 'connection lost'})"
        )

    def fail_pending(self, conn: Connection, reason: str) -> None:
        """Fail every call still waiting on `conn` with an ActorDiedError carrying `reason`."""
        pending, conn.pending = conn.pending, {}
        for group, index in pending.values():
            group.deliver(index, False, ActorDiedError(group.paths[index], reason))
