"""A node: one process's endpoint on the wire (the controller and every worker run one).

It listens on an abstract Unix socket, dials peers directly (actor-to-actor calls never relay
through the controller), routes incoming calls to local actor cells and replies to callers.
Every connection, in or out, proves it belongs to the app before its first frame (_wire.py);
docs/security.md has the threat model.

Frames are described in _frames.py and docs/wire.md.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from .._core._errors import ActorDiedError, ProtocolError
from .._wire import _codec, _secret
from .._wire._accepting import Acceptor
from .._wire._addresses import bind, bind_tcp, listen_address, tcp_address
from .._wire._connection import Connection
from .._wire._frames import (
    CALL,
    CANCEL,
    CAST,
    ERR,
    HELLO,
    OK,
    REPLIES,
    SYS,
    decode_frame,
    remote_error,
)
from .._wire._handshake import accept, dial
from .._wire._peercred import peer_credentials
from .._wire._refusals import RefusalLog
from .._wire._tensors import PendingTensor
from .._wire._unproven import PER_LISTENER, Unproven
from ._calls import CallGroup, ReplyTo
from ._cell import ActorCell
from ._channel import TensorChannel
from ._faults import LinkFaults
from ._outgoing import Outgoing

log = logging.getLogger("otpmesh.node")


SysHandler = Callable[[Connection | None, Any], Awaitable[Any]]
#: How long a new incoming connection has to prove it belongs to the app.
PROOF_TIMEOUT = 10.0
#: How long it has to send its first bytes (a dialer sends its handshake at once), on a Unix
#: socket and over TCP (room for a slow link). The app's own processes get PROOF_TIMEOUT.
FIRST_BYTES_TIMEOUT = 1.0
FIRST_BYTES_TIMEOUT_TCP = 3.0
#: Connections on the Unix socket one process may hold once it proved itself (a worker needs
#: two: calls and its tensor channel's side connection), and those all processes that are not
#: the app's own may hold together (only a holder of the secret gets that far).
PROVEN_PER_PROCESS = 32
PROVEN_STRANGERS = 64
#: Connections from peers that proved nothing yet, per listener (_wire/_unproven.py): a newcomer
#: past the bound evicts the oldest of the peer holding the most.
MAX_UNPROVEN = PER_LISTENER


_CURRENT: trio.lowlevel.RunVar[Node] = trio.lowlevel.RunVar("otpmesh_node")


def current_node() -> Node | None:
    """The node of this trio run (a worker's, or the controller's once started), if any."""
    try:
        return _CURRENT.get()
    except (LookupError, RuntimeError):  # RuntimeError: not inside a trio run at all
        return None


def set_current_node(node: Node) -> None:
    _CURRENT.set(node)


class Node(Outgoing):
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

    # ---------------------------------------------------------------- serving

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                task_status.started()
                await self._accept_loop(self._listener)
        finally:
            self.nursery = None  # closed: nothing may start in it any more

    async def listen_tcp(self, host: str, port: int = 0) -> str:
        """Also accept authenticated TCP connections on `host`:`port`; return that address."""
        if self.tcp_secret is None:
            raise ProtocolError("a node needs the cluster secret before it listens on TCP")
        if self.nursery is None:
            raise RuntimeError("node is not serving")
        raw = bind_tcp(host, port)
        self.tcp_addr = listen_address(raw)
        self._tcp_scope = trio.CancelScope()
        self.nursery.start_soon(self._accept_tcp, raw, self._tcp_scope)
        return self.tcp_addr

    async def _accept_tcp(self, raw: socket.socket, scope: trio.CancelScope) -> None:
        with scope:
            await self._accept_loop(raw)

    def stop_tcp(self) -> None:
        """Stop accepting TCP connections (those already made stay open)."""
        if self._tcp_scope is not None:
            self._tcp_scope.cancel()
            self._tcp_scope = None
            self.tcp_addr = None

    async def _accept_loop(self, raw: socket.socket) -> None:
        tcp = raw.family != socket.AF_UNIX
        with trio.socket.from_stdlib_socket(raw) as listener:
            what = f"node pid {os.getpid()} ({listen_address(raw)!r})"
            self.acceptors[tcp] = acceptor = Acceptor(listener, log, what)
            assert self.nursery is not None
            while True:
                conn, _ = await acceptor.accept()
                sock = socket.socket(fileno=conn.detach())
                sock.setblocking(False)
                self.nursery.start_soon(self._serve_accepted, sock, tcp)

    async def _serve_accepted(self, sock: socket.socket, tcp: bool) -> None:
        peer = "(unknown peer)"
        try:
            peer, key, own, pid = self._peer_of(sock, tcp)
            secret = self.tcp_secret if tcp else self.secret
            if secret is None:
                raise ProtocolError("this node has no secret to check TCP peers with")
            if own:
                with trio.fail_after(PROOF_TIMEOUT):
                    mac = await accept(sock, secret, tcp=tcp)
            else:
                with self.unproven[tcp].hold(key) as slot, trio.fail_after(PROOF_TIMEOUT):
                    first = FIRST_BYTES_TIMEOUT_TCP if tcp else FIRST_BYTES_TIMEOUT
                    with trio.move_on_after(first) as waiting:
                        await trio.lowlevel.wait_readable(sock)
                    if waiting.cancelled_caught:
                        raise ProtocolError(f"sent nothing within {first:g} s")
                    mac = await accept(sock, secret, tcp=tcp)
                if slot.evicted:
                    bound = self.unproven[tcp]
                    raise ProtocolError(
                        f"evicted by newer connections: at most {bound.per_peer} per peer and "
                        f"{bound.per_listener} in all may be proving themselves at once"
                    )
        except (ProtocolError, trio.TooSlowError, OSError) as exc:
            if isinstance(exc, trio.TooSlowError):
                why = f"did not prove itself within {PROOF_TIMEOUT:g} s"
            else:
                why = str(exc) or type(exc).__name__
            self.refusals.refused(peer, why)
            sock.close()
            return
        full = None if tcp else self._proven_refusal(key, own)
        if full is not None:  # a holder of the secret opening connections without end
            self.refusals.refused(peer, full)
            sock.close()
            return
        try:
            await self.run_connection(
                Connection(
                    sock,
                    peer="(incoming)",
                    decode=decode_frame,
                    on_message=self.dispatch,
                    mac=mac,
                    peer_pid=pid,
                )
            )
        finally:
            if not tcp:
                self._proven_closed(key, own)

    def _proven_refusal(self, key: str, own: bool) -> str | None:
        """Why a Unix peer that proved itself may not hold one more connection (None: it may,
        and now does). Knowing the secret is not a licence to fill this process's descriptor
        table: a compromised actor, or a child it forked, holds a bounded number."""
        held = self.proven.get(key, 0)
        if held >= PROVEN_PER_PROCESS:
            return f"it holds {held} connections already (at most {PROVEN_PER_PROCESS})"
        strangers = self.proven_strangers
        if not own and strangers >= PROVEN_STRANGERS:
            return (
                f"processes that are not this app's own hold {strangers} connections already "
                f"(at most {PROVEN_STRANGERS})"
            )
        self.proven[key] = held + 1
        if not own:
            self.proven_strangers = strangers + 1
        return None

    def _proven_closed(self, key: str, own: bool) -> None:
        left = self.proven.pop(key, 1) - 1
        if left:
            self.proven[key] = left
        if not own:
            self.proven_strangers -= 1

    def _peer_of(self, sock: socket.socket, tcp: bool) -> tuple[str, str, bool, int | None]:
        """Who dialed: its name for the log, its key among the unproven (a host over TCP; a
        pid of this user on a Unix socket: another uid is refused at once), whether it is one
        of the app's own processes, and its pid (``SO_PEERCRED``; None over TCP)."""
        if tcp:
            host, port = sock.getpeername()[:2]
            return f"{host}:{port}", str(host), False, None
        pid, uid, _gid = peer_credentials(sock)
        peer = f"pid {pid} (uid {uid})"
        if uid != os.getuid():
            raise ProtocolError(f"peer runs as uid {uid}, not this app's uid {os.getuid()}")
        own = self.is_app_process is not None and self.is_app_process(pid)
        return peer, f"pid {pid}", own, pid

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
            self.fail_pending(conn, conn.close_reason or "connection lost")

    def fail_pending(self, conn: Connection, reason: str) -> None:
        """Fail every call still waiting on `conn` with an ActorDiedError carrying `reason`."""
        pending, conn.pending = conn.pending, {}
        for group, index in pending.values():
            group.deliver(index, False, ActorDiedError(group.paths[index], reason))

    # ---------------------------------------------------------------- incoming

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
        if cell.handle_inline(method, args, kwargs, reply):
            return None
        item = (method, args, kwargs, reply, chain)
        try:
            cell.send.send_nowait(item)
        except trio.WouldBlock:
            return cell.send.send(item)
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
