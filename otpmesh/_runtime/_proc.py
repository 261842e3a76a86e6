"""A worker process as the controller sees it (``Proc``), and how its registration is checked:
the one-time token its HELLO must carry, the pid it must come from, and the heartbeat settings
it is judged by. The controller runtime (_controller_runtime.py) keeps the live ones.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import trio

from .._wire._connection import Connection
from .._wire._refusals import describe_peer
from ._workerpipes import WorkerPipes

#: Workers beat at most this often (see beat_interval); one silent for its heartbeat timeout
#: (HEARTBEAT_TIMEOUT unless set) is hung (SIGSTOP, wedged) and killed.
HEARTBEAT_INTERVAL = float(os.environ.get("OTPMESH_HEARTBEAT_INTERVAL", "0.2"))
HEARTBEAT_TIMEOUT = float(os.environ.get("OTPMESH_HEARTBEAT_TIMEOUT", "2.0"))
#: Beats a worker sends per heartbeat timeout, when that is not more often than HEARTBEAT_INTERVAL.
BEATS_PER_TIMEOUT = 4


def beat_interval(timeout: float) -> float:
    """How often a worker whose heartbeat timeout is `timeout` beats. Every beat wakes the
    controller once: 4 per timeout, not one per 0.2 s, is what keeps a thousand idle workers
    from costing the controller a third of a core (measured: 200 idle workers, 7.6% of a core
    at 0.2 s). 4 beats leave a late beat 3 intervals of slack before the timeout."""
    return max(HEARTBEAT_INTERVAL, timeout / BEATS_PER_TIMEOUT)


_ERR_TAIL = 400  # stderr lines kept per process (where a faulthandler dump is read back)
#: Bytes of the one-time token a forked worker presents in its HELLO (_worker.py).
REGISTRATION_TOKEN_SIZE = 32


def new_registration_token() -> bytes:
    """A fresh one-time token that only the process (worker or host agent) given it can present."""
    return secrets.token_bytes(REGISTRATION_TOKEN_SIZE)


def token_matches(given: object, expected: bytes | None) -> bool:
    """Whether `given` (from the wire: anything) is the one-time token `expected`, compared in
    constant time. Only bytes compare: a str (msgpack's other string type) never matches and,
    unlike a non-ASCII str handed to ``compare_digest``, never raises."""
    return type(given) is bytes and expected is not None and hmac.compare_digest(given, expected)


def hello_peer(conn: Connection) -> str:
    """Who sent a HELLO on `conn`, for the refusal log: 'pid P (uid U)', or 'HOST:PORT'."""
    try:
        return describe_peer(conn.sock, conn.sock.family != socket.AF_UNIX)
    except OSError:
        return "(a peer already gone)"


@dataclass(eq=False)
class Proc:
    """One worker process of a proc mesh, as the controller sees it."""

    rank: int
    coords: dict[str, int]
    proc_id: str
    pid: int = 0
    addr: str = ""
    conn: Connection | None = None
    exit_reason: str | None = None
    actors: dict[str, int] = field(default_factory=dict)  # actor path -> incarnation
    names: list[str] = field(default_factory=list)  # every actor path it hosted (output prefix)
    hang_reason: str | None = None  # set when the heartbeat watchdog killed it
    hung: dict[str, Any] | None = None  # its watchdog's report: an actor past its deadline
    pipes: WorkerPipes | None = None  # its beat and control pipes (forked on this host)
    shut_down: bool = False  # stopped on purpose, with its host (its actors exit 'shutdown')
    host: Any = None  # the agent host that forked it (None: this host's own fork server)
    ready: trio.Event = field(default_factory=trio.Event)
    exited: trio.Event = field(default_factory=trio.Event)
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT  # its app's (otpmesh.start(heartbeat_timeout=))
    # The one-time token only its forked process was given; None once its HELLO used it.
    token: bytes | None = field(default_factory=new_registration_token, repr=False)
    forked: trio.Event = field(default_factory=trio.Event)  # its fork server reported its pid
    # Its last lines on stderr, counted: where a faulthandler dump is read back (hung()).
    err_tail: deque[str] = field(default_factory=lambda: deque(maxlen=_ERR_TAIL))
    err_count: int = 0
    # It answered a spawn: judged by its heartbeat alone from now on (_liveness.START_SILENCE).
    started: bool = False
    # Its runtime's index of actor paths to the process hosting them (Runtime.host_of).
    index: dict[str, Proc] | None = field(default=None, repr=False)
    # Its death lock's page (_deathlock.py), from its fork server, until it is watched.
    lock_page: int | None = field(default=None, repr=False)
    #: What told the controller it died first: "deathlock" (its lock released: before its
    #: memory was torn down), "connection" (its socket's end), or "fork server" (its report).
    noticed_by: str | None = None
    # The controller asked it to exit (shutdown): its lock's release is no news.
    stop_asked: bool = False

    @property
    def alive(self) -> bool:
        return self.exit_reason is None

    def label(self) -> str:
        return ",".join(self.names) if self.names else f"proc/{self.rank}"

    def hosted(self, path: str, incarnation: int) -> None:
        self.actors[path] = incarnation
        if self.index is not None:
            self.index[path] = self
        self.named(path)

    def named(self, path: str) -> None:
        """Prefix this process's output with `path` (from its constructor's first print on)."""
        if path not in self.names:
            self.names.append(path)

    def death(self, how: str | None = None) -> str:
        """How it died, in the words a call into it fails with (`how`: its exit, if not
        recorded yet)."""
        return f"its process (pid {self.pid}) {how or self.exit_reason or 'is gone'}"


def hello_refusal(proc: Proc | None, payload: Any) -> str | None:
    """Why a worker HELLO is not `proc`'s own forked process's (None: it may be, if it also
    comes from the right pid, peer_refusal). It must carry the one-time token that only that
    process was given, unused."""
    if proc is None:
        return "no worker process of this controller has that proc id"
    if not proc.alive:
        return f"that process {proc.exit_reason}"
    if proc.conn is not None or proc.token is None:
        return "that process has registered already"
    if not token_matches(payload.get("token"), proc.token):
        return "its registration token is missing or wrong"
    if not isinstance(payload.get("addr"), str) or type(payload.get("pid")) is not int:
        return "it lacks the worker's address or pid"
    return None


def peer_refusal(conn: Connection, proc: Proc | None) -> str | None:
    """On this host, the kernel's word on who dialed (``SO_PEERCRED``) must be the pid the fork
    server forked for `proc`: then even a process that read the token elsewhere (a sibling's
    memory) cannot present it. Across hosts the token alone vouches for it."""
    if proc is None or proc.host is not None:
        return None
    if not proc.forked.is_set():
        return "its fork server has not said which pid it forked for it"
    if conn.peer_pid != proc.pid:
        return f"it comes from pid {conn.peer_pid}, not from pid {proc.pid}, forked for it"
    return None


def lines_since(proc: Proc, mark: int) -> list[str]:
    """`proc`'s stderr lines after its `mark`-th (as many as are kept)."""
    count = min(proc.err_count - mark, len(proc.err_tail))
    return list(proc.err_tail)[-count:] if count > 0 else []
