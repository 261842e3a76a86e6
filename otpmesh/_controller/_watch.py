"""What ``otpmesh watch PID`` attaches to: a read-only view of the apps a controller runs.

While an app runs, its controller listens on a Unix socket in its user's private stacks
directory (``_stacksdir.py``: 0700, checked with ``lstat``), ``watch-PID.sock``, beside a 0600
file ``watch-PID.token`` holding the controller's start time (a pid alone may be reused) and a
random watch token made for this listener. The app's secret is never in it, nor sent.

A watcher proves itself as a node does, with the token instead of the secret: the kernel's word
that it is this user (``SO_PEERCRED``; the directory already keeps others out), then the
challenge-response of ``_secret.py`` (within ``PROOF_TIMEOUT``, holding a bounded, evictable
share of the listener while it does: ``_watchers.py``); then it sends one request line:

    {"op": "watch", "app": ROOT or null}   the tree's outline, every log entry so far, "live",
                                          each new entry, the app's clock every TICK seconds,
                                          "end" when the app has stopped; and the outline of
                                          each subtree an actor owns ("subtree"), once, before
                                          the entries that follow its start
    {"op": "stacks", "path": "..."}       (also while watching) the actors' stacks, once

and reads JSON lines. Nothing it can send starts, stops or calls anything: the listener is not
the app's node, and a watcher never holds the app's secret. At most ``MAX_WATCHERS`` are served
at once, ``WATCHERS_PER_PROCESS`` for one process (one more is told why and closed); a request
line is at most ``MAX_REQUEST`` bytes. One trio run per process serves watchers (the first to
start an app; a notebook's is its app thread).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .._core._outline import outline
from .._core._reasons import is_normal_exit
from .._core._supevents import LogEntry
from .._runtime._controller_runtime import runtime
from .._wire._addresses import UNIX_BACKLOG
from .._wire._owntasks import spawn as spawn_own
from .._wire._peercred import peer_credentials
from .._wire._secret import (
    NONCE_SIZE,
    PROOF_SIZE,
    acceptor_proof,
    dialer_proof,
    new_nonce,
    proof_ok,
)
from ._events import entry_to_json
from ._inspect import collect, started_at
from ._stacksdir import is_private, make_private_dir
from ._watchers import Watchers

if TYPE_CHECKING:
    from ._tree import TreeContext

log = logging.getLogger("otpmesh")

MAX_REQUEST = 4096
PROOF_TIMEOUT = 2.0
#: How often a watcher is told the app's clock (its view's durations and intensity windows).
TICK = 0.5

Send = Callable[[dict[str, Any]], Awaitable[None]]


def socket_path(directory: Path, pid: int) -> Path:
    return directory / f"watch-{pid}.sock"


def token_path(directory: Path, pid: int) -> Path:
    return directory / f"watch-{pid}.token"


class Watched:
    """The apps of one trio run that a watcher may see, in start order."""

    def __init__(self) -> None:
        self.apps: list[TreeContext] = []
        self.changed = trio.Event()
        self.serving = False
        #: The listener's bounds and accept loop, while it listens.
        self.watchers: Watchers | None = None

    def add(self, ctx: TreeContext) -> None:
        self.apps.append(ctx)
        self._changed()

    def remove(self, ctx: TreeContext) -> None:
        self.apps.remove(ctx)
        self._changed()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def find(self, root: str | None) -> TreeContext | None:
        for ctx in self.apps:
            if root is None or ctx.tree.id == root:
                return ctx
        return None


_WATCHED: trio.lowlevel.RunVar[Watched] = trio.lowlevel.RunVar("otpmesh_watched")


def watched_apps() -> Watched:
    """This trio run's watchable apps (``otpmesh run file.py:main`` follows them too)."""
    try:
        return _WATCHED.get()
    except LookupError:
        watched = Watched()
        _WATCHED.set(watched)
        return watched


@asynccontextmanager
async def watchable(ctx: TreeContext) -> AsyncIterator[None]:
    """While the block runs, `ctx`'s app is listed for watchers; the first app of a trio run
    starts this controller's listener, which serves until the run ends."""
    watched = watched_apps()
    if not watched.serving:
        watched.serving = True
        spawn_own(_serve, watched, name="otpmesh-watch")
    watched.add(ctx)
    try:
        yield
    finally:
        watched.remove(ctx)


async def _serve(watched: Watched) -> None:
    pid = os.getpid()
    try:
        directory, _ = make_private_dir()  # the stacks listener logs why, if it is a fallback
        sock_file, token_file = socket_path(directory, pid), token_path(directory, pid)
        token = secrets.token_bytes(32)
        if _answering(sock_file):
            return  # another trio run of this process serves watchers: its apps are watched
        sock_file.unlink(missing_ok=True)  # a listener of ours that died with its process
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await listener.bind(str(sock_file))
        # A node's backlog: past a full one a Unix connect fails at once (EAGAIN) instead of
        # waiting its turn. What waits there (a flood, anything while accepting waits out
        # EMFILE) costs no descriptor; what is accepted is bounded (_watchers.py).
        listener.listen(UNIX_BACKLOG)
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"started": started_at(pid), "token": token.hex()}, f)
    except OSError as exc:
        log.warning("otpmesh watch will not reach this app: %s", exc)
        return
    watched.watchers = watchers = Watchers(listener, log)
    try:
        async with trio.open_nursery() as nursery:
            while True:
                conn, _ = await watchers.acceptor.accept()
                nursery.start_soon(_watcher, watched, watchers, conn, token)
    except Exception:
        # A system task: what escapes it would end the whole program. Only watching ends.
        log.exception("otpmesh watch stopped answering this app")
    finally:
        watched.watchers = None
        listener.close()
        if is_private(directory):
            token_file.unlink(missing_ok=True)
            sock_file.unlink(missing_ok=True)


def _answering(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)  # a full backlog would block a plain connect
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


async def _watcher(
    watched: Watched, watchers: Watchers, conn: trio.socket.SocketType, token: bytes
) -> None:
    raw = socket.socket(fileno=conn.detach())  # the stdlib's, for the kernel's word on its peer
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(raw))
    try:
        async with stream:
            pid, uid, _ = peer_credentials(raw)
            if uid != os.getuid():
                return  # the directory keeps other users out; the kernel's word, to be sure
            proven = False
            with watchers.unproven.hold(f"pid {pid}"), trio.move_on_after(PROOF_TIMEOUT):
                proven = await _prove(stream, token)
            if not proven:
                return  # a wrong proof, none in time, or evicted by newer connections
            refusal = watchers.admit(pid)
            if refusal is not None:
                with trio.move_on_after(PROOF_TIMEOUT):
                    await stream.send_all(_line({"t": "error", "error": refusal}))
                return
            try:
                await _answer(watched, stream)
            finally:
                watchers.leave(pid)
    except Exception as exc:
        # It went away or broke the protocol (or a bug here): only its connection ends.
        log.debug("a watcher's connection ended: %r", exc)


async def _prove(stream: trio.SocketStream, token: bytes) -> bool:
    nonce_a = new_nonce()
    await stream.send_all(nonce_a)
    answer = await receive_exactly(stream, NONCE_SIZE + PROOF_SIZE)
    nonce_d, proof = answer[:NONCE_SIZE], answer[NONCE_SIZE:]
    if not proof_ok(dialer_proof(token, nonce_a, nonce_d), proof):
        return False
    await stream.send_all(acceptor_proof(token, nonce_a, nonce_d))
    return True


async def receive_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            raise trio.BrokenResourceError("closed")
        data += chunk
    return data


class Lines:
    """JSON lines from a stream, each at most `limit` bytes."""

    def __init__(self, stream: trio.SocketStream, limit: int) -> None:
        self.stream, self.limit, self.buffer = stream, limit, b""

    async def next(self) -> Any:
        while b"\n" not in self.buffer:
            if len(self.buffer) > self.limit:
                raise ValueError(f"a line of more than {self.limit} bytes")
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise trio.BrokenResourceError("closed")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)


async def _answer(watched: Watched, stream: trio.SocketStream) -> None:
    lines = Lines(stream, MAX_REQUEST)
    send_lock = trio.Lock()

    async def send(message: dict[str, Any]) -> None:
        async with send_lock:
            await stream.send_all(_line(message))

    request = await lines.next()
    ctx = watched.find(request.get("app"))
    if ctx is None:
        asked = request.get("app")
        what = "no app runs here" if asked is None else f"no app with root {asked!r} runs here"
        roots = ", ".join(str(c.tree.id) for c in watched.apps) or "none"
        await send({"t": "error", "error": f"{what} (running: {roots})"})
        return
    if request.get("op") == "stacks":
        await _send_stacks(ctx, send, request)
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_follow, ctx, send, nursery.cancel_scope)
        while True:
            request = await lines.next()
            if request.get("op") == "stacks":
                await _send_stacks(ctx, send, request)


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


async def _send_stacks(ctx: TreeContext, send: Send, request: dict[str, Any]) -> None:
    path = str(request.get("path") or "")
    stacks = await collect(await runtime(), path)
    await send({"t": "stacks", "stacks": stacks.under(ctx.tree.id).under(path).to_json()})


async def _follow(ctx: TreeContext, send: Send, done: trio.CancelScope) -> None:
    """The outline, then every entry by index (a slow watcher costs no memory of its own), the
    app's clock at least every TICK seconds, and "end" once the app's log closes."""
    await send({"t": "tree", "outline": outline(ctx.tree), "now": trio.current_time()})
    seen = 0
    shown: set[int] = set()  # the owned subtrees whose outlines were sent
    changed = trio.Event()
    ended = live = False

    async def listen() -> None:
        nonlocal ended
        async for _ in ctx.events.subscribe():
            changed.set()
        ended = True
        changed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(listen)
        while True:
            for sub in _owned(ctx):  # each owned subtree's supervisors, with their settings
                if id(sub) not in shown:
                    shown.add(id(sub))
                    owner = sub.root.path.rpartition("/")[0]
                    await send({"t": "subtree", "outline": outline(sub.tree, owner)})
            while seen < len(ctx.events):
                await send(entry_message(ctx.events[seen]))
                seen += 1
            if not live:
                live = True
                await send({"t": "live"})  # what came before was the backlog
            if ended:
                break
            await send({"t": "now", "now": trio.current_time()})
            with trio.move_on_after(TICK):
                await changed.wait()
            changed = trio.Event()
        nursery.cancel_scope.cancel()
    await send({"t": "end"})
    done.cancel()


def _owned(ctx: TreeContext) -> list[TreeContext]:
    """The trees actors of `ctx` own, at any depth, those started first first."""
    found = []
    for sub in list(ctx.subtrees):
        if getattr(sub, "root", None) is not None:  # started: its root driver runs
            found.append(sub)
            found.extend(_owned(sub))
    return found


def entry_message(entry: LogEntry) -> dict[str, Any]:
    """A log entry as a watcher gets it: as an events file has it, and whether it is normal."""
    normal = entry.reason is not None and is_normal_exit(entry.reason)
    return {"t": "entry", **entry_to_json(entry), "normal": normal}
