"""A node's incoming connections, admitted: the accept loops (Unix, and TCP once asked), each
peer's proof that it belongs to the app (``accept``, _wire/_handshake.py) within a time limit, and
bounds on the connections of peers that proved nothing yet (_wire/_unproven.py) and of those
that did. ``Node`` inherits it; what it uses of the node is declared below.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from .._core._errors import ProtocolError
from .._wire._accepting import Acceptor
from .._wire._addresses import bind_tcp, listen_address
from .._wire._connection import Connection
from .._wire._frames import decode_frame
from .._wire._handshake import accept
from .._wire._peercred import peer_credentials
from .._wire._refusals import RefusalLog
from .._wire._tensors import PendingTensor
from .._wire._unproven import PER_LISTENER, Unproven

log = logging.getLogger("otpmesh.node")

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


class Admission:
    """Accepting and proving incoming connections (a part of ``Node``)."""

    secret: bytes
    tcp_secret: bytes | None
    tcp_addr: str | None
    _tcp_scope: trio.CancelScope | None
    nursery: trio.Nursery | None
    refusals: RefusalLog
    is_app_process: Callable[[int], bool] | None
    unproven: dict[bool, Unproven]
    proven: dict[str, int]
    proven_strangers: int
    acceptors: dict[bool, Acceptor]

    if TYPE_CHECKING:  # the node's own (declared here for the type checker only)

        def dispatch(
            self, conn: Connection, msg: list[Any], pending: Sequence[PendingTensor] = ()
        ) -> Awaitable[None] | None: ...

        async def run_connection(self, conn: Connection) -> None: ...

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
