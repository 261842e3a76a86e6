"""The fork server's side of a takeover: it outlives its controller for a grace period, and
hands its children to a standby controller that proves the app's secret and a higher epoch,
once its own controller is gone, and only to the process the kernel says holds the lease.

Runs inside the fork server (plain sockets, no trio). The standby dials ``forkserver.sock`` in
the takeover's state directory (0700: only this user reaches it; the kernel's word on the
peer's uid is checked too), then:

    fork server -> standby    {"op": "challenge", "nonce"}
    standby -> fork server    {"op": "attach", "epoch", "proof": attach_proof(...)}
    fork server -> standby    {"op": "ready", "pid", "children", "epoch"}, then the exits it
                              saw while no controller was attached
or                            {"op": "refused", "why"}, then it hangs up: a stale epoch, a
                              controller still attached, a dialer that does not hold the lease.

A wrong proof gets no answer at all. The secret alone is not enough: every actor of the app
knows it, and one that could attach while its controller lives would fence that controller
(told it is cut off, it marks every worker dead and can no longer fork). So the server attaches
a standby only while no controller is attached, and only a dialer whose pid (``SO_PEERCRED``,
the kernel's word) the kernel names as the holder of the takeover's lease (``/proc/locks``),
at the epoch in the state directory, which the lease holder wrote. An actor cannot hold the
lease while its controller lives, which holds it until it stops.
"""

from __future__ import annotations

import array
import hashlib
import hmac
import os
import secrets
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from .._core._errors import FencedError
from .._wire._peercred import peer_credentials
from ._lease import holds

#: How long a dialer of the standby socket has to prove itself. The server goes on serving its
#: children meanwhile: a dialer that says nothing holds one of MAX_PENDING places, not the server.
PROOF_TIMEOUT = 2.0
#: Dialers proving themselves at once; one more evicts the oldest, once it has had FAIR_CHANCE.
MAX_PENDING = 8
#: How long a dialer holds its place before a newcomer may take it. While every place is held
#: by a dialer younger than this, the server accepts nobody: the next dialer waits in the
#: listener's backlog, so a flood of dialers slows a standby's turn but cannot cut it short.
FAIR_CHANCE = 0.5
_MAX = 1 << 16
#: How long a standby tries again to attach when its dial fails on the way (see dial_standby).
DIAL_RETRY = 10.0
#: How long a standby asks again while the server still has its old controller attached (its
#: exit, which released the lease, reaches the server within milliseconds).
ATTACHED_WAIT = 2.0
#: How long one connect waits for a place in the listener's backlog.
_CONNECT_WAIT = 2.0
_HUNG_UP = "it hung up"
#: The refusal while a controller is attached (the dead one's exit not seen yet: asked again).
ATTACHED = "its controller is attached"


def attach_proof(secret: bytes, nonce: bytes, epoch: int) -> bytes:
    """What a controller presents to attach at `epoch` (bound to it: no replay at another)."""
    return hmac.new(
        secret, b"otpmesh-forkserver" + nonce + str(epoch).encode(), hashlib.sha256
    ).digest()


async def dial_standby(
    path: str, secret: bytes, epoch: int
) -> tuple[socket.socket, dict[str, Any]]:
    """The controller's side: attach to the fork server listening at `path` at `epoch`; the
    socket and the server's "ready". FencedError if it refuses (a stale epoch), OSError if it
    is gone (no socket file, nobody listening).

    A same-user process without the secret can still connect, and a flood of them fills the
    listener's backlog and the server's places (MAX_PENDING). The connect blocks in the
    kernel's queue for a place in the backlog (a non-blocking one fails at once, or seems to
    succeed and then reads ENOTCONN, and never holds a place in that queue); once accepted,
    the dialer keeps its place for FAIR_CHANCE at least. A failure on the way is still tried
    again, 10 ms apart doubling up to 0.2 s, for up to DIAL_RETRY seconds. Before, one failed
    dial made a standby take the fork server for gone and start afresh, its children and their
    state lost."""
    import trio

    start = trio.current_time()
    pause = 0.01
    while True:
        try:
            return await _dial_once(path, secret, epoch)
        except (FencedError, OSError) as exc:
            gone = isinstance(exc, FileNotFoundError | ConnectionRefusedError)
            # Its old controller's exit may not have reached it yet (the lease is released in
            # the same exit): that refusal is asked again for a while, the others are final.
            why = str(exc)
            attached = ATTACHED in why
            refused = isinstance(exc, FencedError) and not (why.endswith(_HUNG_UP) or attached)
            waited = trio.current_time() + pause - start
            if gone or refused or waited > (ATTACHED_WAIT if attached else DIAL_RETRY):
                raise
        await trio.sleep(pause * (0.5 + secrets.randbelow(1000) / 1000))
        pause = min(2 * pause, 0.2)


async def _dial_once(path: str, secret: bytes, epoch: int) -> tuple[socket.socket, dict[str, Any]]:
    import trio

    raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        # Blocking, in a thread: it waits its turn in the listener's queue, for _CONNECT_WAIT
        # at most (SO_SNDTIMEO bounds a Unix socket's connect; EAGAIN then, tried again).
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(_CONNECT_WAIT))
        await trio.to_thread.run_sync(raw.connect, path, abandon_on_cancel=True)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(0.0))
    except BaseException:
        raw.close()
        raise
    sock = trio.socket.from_stdlib_socket(raw)
    try:
        data = await sock.recv(_MAX)
        if not data:
            raise ConnectionResetError("the fork server closed the connection before its challenge")
        challenge = msgpack.unpackb(data)
        proof = attach_proof(secret, challenge["nonce"], epoch)
        await sock.send(msgpack.packb({"op": "attach", "epoch": epoch, "proof": proof}))
        data = await sock.recv(_MAX)
    except BaseException:
        sock.close()
        raise
    reply = msgpack.unpackb(data) if data else {"op": "refused", "why": _HUNG_UP}
    if reply.get("op") != "ready":
        sock.close()
        raise FencedError(f"the fork server refused the takeover: {reply.get('why')}")
    return raw, reply


def _read_epoch(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _timeval(seconds: float) -> bytes:
    return struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))


class ControllerLink:
    """The fork server's socket to its controller, if one is attached; reports made while none
    is are kept for the next one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock: socket.socket | None = sock
        self._held: list[dict[str, Any]] = []

    def send(self, msg: dict[str, Any], fd: int | None = None) -> None:
        """Send `msg`, with descriptor `fd` (closed here, sent or not): held without it while
        no controller is attached."""
        if self.sock is None:
            self._held.append(msg)
        else:
            try:
                if fd is None:
                    self.sock.send(msgpack.packb(msg))
                else:
                    self.sock.sendmsg(
                        [msgpack.packb(msg)],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))],
                    )
            except OSError:
                self._held.append(msg)  # it is going: its EOF comes next
        if fd is not None:
            os.close(fd)

    def lost(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None

    def attach(self, sock: socket.socket, epoch: int, children: list[int]) -> None:
        """Serve `sock`, a standby at `epoch` (only while none is attached: Standby.answer)."""
        self.sock = sock
        held, self._held = self._held, []
        self.send({"op": "ready", "pid": os.getpid(), "children": children, "epoch": epoch})
        for msg in held:
            self.send(msg)


@dataclass(slots=True)
class _Dialer:
    """A dialer that was sent a challenge."""

    nonce: bytes
    since: float  # when it was admitted (time.monotonic)
    pid: int  # the kernel's word on the process that connected
    replaced: bool = False  # the same process dialed again: this one goes at the next expire


class Standby:
    """The listener a standby controller attaches through, and the grace period's clock.

    The fork server's select loop owns the sockets: ``admit`` when the listener is readable
    (and ``full`` is false), ``answer`` when a dialer it admitted is, ``expire`` on every pass.
    Nothing here blocks, so a dialer that connects and says nothing costs the server nothing but
    a place in ``pending``. A process holds one place (its newer dial takes its older one's), so
    a few flooding processes cannot take a standby's; many can only make it wait its turn.
    """

    def __init__(self, req: dict[str, Any]) -> None:
        self.secret: bytes = req["secret"]
        self.epoch: int = int(req["epoch"])
        self.grace: float = float(req["grace"])
        #: The lease file a dialer must hold, and the epoch file its holder writes.
        self.lease = str(req["lease"])
        self.epoch_file = str(req["epoch_file"])
        self.path = path = str(req["socket"])
        try:
            os.unlink(path)  # a socket file left by an earlier run of this app
        except FileNotFoundError:
            pass
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(4)
        self.listener.setblocking(False)
        #: Dialers that were sent a challenge, in the order they were admitted.
        self.pending: dict[socket.socket, _Dialer] = {}
        self._deadline = 0.0

    def _refusal(self, epoch: int, pid: int, attached: bool) -> str | None:
        """Why a dialer that proved the secret at `epoch` is not attached, or None."""
        if epoch <= self.epoch:
            return f"epoch {epoch} is not above the epoch served, {self.epoch}: fenced"
        if attached:
            return f"{ATTACHED}: a standby attaches only once it is gone"
        if not holds(self.lease, pid):
            return f"pid {pid} does not hold the takeover's lease ({self.lease})"
        written = _read_epoch(self.epoch_file)
        if epoch != written:
            return f"epoch {epoch} is not the one its lease holder wrote ({written})"
        return None

    def close_fds(self) -> None:
        """Close the listener and the pending dialers' sockets (a forked worker's copies)."""
        self.listener.close()
        for conn in self.pending:
            conn.close()
        self.pending.clear()

    def close(self) -> None:
        """Stop listening, and take the socket file away: nobody attaches to a server gone."""
        self.close_fds()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def wait_from_now(self) -> None:
        self._deadline = time.monotonic() + self.grace

    def left(self) -> float:
        return self._deadline - time.monotonic()

    def next_due(self) -> float | None:
        """Seconds until the next pass has work: a dialer replaced, the oldest proof due, or
        (every place taken) the oldest dialer's fair chance over; None if none is pending."""
        if not self.pending:
            return None
        if any(d.replaced for d in self.pending.values()):
            return 0.0
        due = min(d.since for d in self.pending.values()) + PROOF_TIMEOUT
        if len(self.pending) >= MAX_PENDING:
            due = min(due, self._fair_chance_ends())
        return max(0.0, due - time.monotonic())

    def full(self) -> bool:
        """Whether every place is held by a dialer that has not had FAIR_CHANCE yet: the
        listener is not to be served until it has (a newcomer waits in the backlog)."""
        return len(self.pending) >= MAX_PENDING and time.monotonic() < self._fair_chance_ends()

    def _fair_chance_ends(self) -> float:
        oldest = next(iter(self.pending.values()))  # dicts keep admission order
        return oldest.since + FAIR_CHANCE

    def admit(self) -> socket.socket | None:
        """Accept a dialer of this user and challenge it; the socket to watch for its proof, or
        None (nobody was there, or another user). A dialer of the same process it replaces is
        dropped at the next ``expire``, which returns it for the caller's selector."""
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return None
        try:
            conn.setblocking(False)
            pid, uid, _gid = peer_credentials(conn)
            if uid != os.getuid():
                conn.close()
                return None
            nonce = secrets.token_bytes(32)
            conn.send(msgpack.packb({"op": "challenge", "nonce": nonce}))
        except OSError:
            conn.close()
            return None
        for dialer in self.pending.values():
            if pid and dialer.pid == pid:  # 0: a process of a pid namespace it cannot see
                dialer.replaced = True
        self.pending[conn] = _Dialer(nonce, time.monotonic(), pid)
        return conn

    def expire(self) -> list[socket.socket]:
        """Close and forget dialers replaced or whose proof is overdue, and the oldest beyond
        MAX_PENDING; the sockets dropped (for the caller's selector)."""
        overdue = time.monotonic() - PROOF_TIMEOUT
        dropped = [c for c, d in self.pending.items() if d.replaced or d.since <= overdue]
        overflow = len(self.pending) - len(dropped) - MAX_PENDING
        if overflow > 0:  # dicts keep insertion order: the oldest first
            live = [conn for conn in self.pending if conn not in dropped]
            dropped += live[:overflow]
        for conn in dropped:
            del self.pending[conn]
            conn.close()
        return dropped

    def answer(self, conn: socket.socket, attached: bool) -> socket.socket | None:
        """Read a pending dialer's proof: its socket (blocking again) if it proved the secret at
        a higher epoch while no controller is `attached`, holding the lease, which it then
        serves; otherwise None, the dialer closed and forgotten."""
        dialer = self.pending.pop(conn)
        nonce = dialer.nonce
        try:
            msg = msgpack.unpackb(conn.recv(_MAX))
            epoch = msg.get("epoch") if isinstance(msg, dict) else None
            proof = msg.get("proof") if isinstance(msg, dict) else None
            if type(epoch) is not int or type(proof) is not bytes:
                conn.close()
                return None
            if not hmac.compare_digest(proof, attach_proof(self.secret, nonce, epoch)):
                conn.close()  # no secret, no answer
                return None
            why = self._refusal(epoch, dialer.pid, attached)
            if why is not None:
                conn.send(msgpack.packb({"op": "refused", "why": why}))
                conn.close()
                return None
        except (OSError, ValueError, msgpack.UnpackException):
            conn.close()
            return None
        conn.setblocking(True)
        self.epoch = epoch
        return conn
