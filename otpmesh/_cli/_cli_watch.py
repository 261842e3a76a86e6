"""``otpmesh watch [PID]``: a running app's tree, live, from outside it.

It attaches to the app's watch listener (``otpmesh/_controller/_watch.py``: a socket in this
user's private directory, a token only this user can read) and shows what ``otpmesh run``
shows: every node's state, incarnation, restarts, intensity used, last exit, and the recent
events; on a terminal, ``s`` adds the actors' stacks and ``q`` quits. It can only look.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import termios
import tty
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from .._controller._events import EventLog
from .._controller._inspect import Stacks, started_at
from .._controller._stacksdir import trusted_dirs
from .._controller._watch import Lines, receive_exactly, socket_path, token_path
from .._core._errors import UsageError
from .._core._reasons import Reported
from .._core._supevents import LogEntry, LogKind
from .._wire._secret import NONCE_SIZE, acceptor_proof, dialer_proof, new_nonce, proof_ok
from ._display import Display, LiveDisplay, PlainDisplay, Watch

DESCRIPTION = """\
Show a running otpmesh app's supervision tree live, from another terminal: every
supervisor, mesh and actor with its state, incarnation, restarts, restart
intensity used of its limit and last exit, and the recent events. PID is the
app's controller process (a script, `otpmesh run`, a notebook's kernel); it
must be yours, and may be left out when only one is running. On a terminal,
`s` shows what every actor is doing (its stacks) and `q` quits.

Watching changes nothing in the app: the watcher proves it is you with a token
in a file only you can read, and can only look. When the app stops, so does
the watch (status 0); Ctrl-C stops watching (status 130), never the app.
"""

EXAMPLES = """\
examples:
  otpmesh watch 4242
  otpmesh watch                      # the only app running
  otpmesh watch 4242 --app rl --plain | tee watch.log
  otpmesh watch 4242 --stacks        # print the stacks once
"""

#: The most a line from the app may hold (stacks of many actors).
MAX_LINE = 64 * 1024 * 1024


def add_to(commands: Any) -> None:
    parser = commands.add_parser(
        "watch",
        help="show a running app's tree live",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "pid", type=int, nargs="?", help="the app's controller process (default: the only one)"
    )
    parser.add_argument(
        "--app",
        metavar="ROOT",
        help="the tree whose root has this id, when the process runs several",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="print lines even on a terminal (the default when stdout is not a terminal)",
    )
    parser.add_argument(
        "--stacks", action="store_true", help="print what every actor is doing, once, and exit"
    )
    parser.set_defaults(handler=run_command)


# ---------------------------------------------------------------------- finding and proving


def watchable_apps() -> dict[int, Path]:
    """This user's controllers that answer ``otpmesh watch`` now, with their directories."""
    found: dict[int, Path] = {}
    for directory in trusted_dirs():
        for marker in directory.glob("watch-*.token"):
            pid = marker.name.removeprefix("watch-").removesuffix(".token")
            if pid.isdigit() and _read_token(directory, int(pid)) is not None:
                found.setdefault(int(pid), directory)
    return found


def _read_token(directory: Path, pid: int) -> bytes | None:
    """The watch token `pid` left, if `pid` is still the process that left it."""
    try:
        data = json.loads(token_path(directory, pid).read_text())
        token = bytes.fromhex(data["token"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return token if data.get("started") == started_at(pid) and data.get("started") else None


class Attached:
    """A proven connection to an app's watch listener: JSON lines both ways."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.lines = Lines(stream, MAX_LINE)

    @classmethod
    async def connect(cls, pid: int) -> Attached:
        directory = watchable_apps().get(pid)
        token = None if directory is None else _read_token(directory, pid)
        if directory is None or token is None:
            running = sorted(watchable_apps())
            apps = f"running: {', '.join(map(str, running))}" if running else "none is running"
            raise UsageError(f"process {pid} is not a running otpmesh app of yours ({apps})")
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        try:
            await sock.connect(str(socket_path(directory, pid)))
        except OSError as exc:
            sock.close()
            raise UsageError(f"cannot reach process {pid}'s app: {exc.strerror}") from None
        stream = trio.SocketStream(sock)
        nonce_a = await receive_exactly(stream, NONCE_SIZE)
        nonce_d = new_nonce()
        await stream.send_all(nonce_d + dialer_proof(token, nonce_a, nonce_d))
        answer = await receive_exactly(stream, len(nonce_a))
        if not proof_ok(acceptor_proof(token, nonce_a, nonce_d), answer):
            await stream.aclose()
            raise UsageError(f"process {pid} did not prove it is the app that wrote its token")
        return cls(stream)

    async def send(self, message: dict[str, Any]) -> None:
        await self.stream.send_all(json.dumps(message).encode() + b"\n")

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            try:
                message = await self.lines.next()
            except trio.BrokenResourceError:
                return
            if isinstance(message, dict):
                yield message


# ---------------------------------------------------------------------- following


def entry_of(message: dict[str, Any]) -> LogEntry:
    """A log entry as the app sent it (``_watch.entry_message``)."""
    reason = message.get("reason")
    return LogEntry(
        float(message["time"]),
        LogKind(message["kind"]),
        str(message["path"]),
        message.get("child"),
        message.get("incarnation"),
        None if reason is None else Reported(str(reason), bool(message.get("normal"))),
    )


async def follow(
    attached: Attached,
    app: str | None,
    heading: str,
    display: Display,
    nursery: trio.Nursery,
    shown: list[Watch],
) -> None:
    """Watch `app` (None: the first) on `display` until it stops or the connection ends; the
    display runs in `nursery` and its Watch is put in `shown` once the tree arrives."""
    await attached.send({"op": "watch", "app": app})
    live = False
    async for message in attached.messages():
        kind = message.get("t")
        if kind == "error":
            raise UsageError(str(message.get("error")))
        if kind == "tree":
            outline = [tuple(row) for row in message["outline"]]
            watch = Watch(outline, heading)
            watch.log = EventLog()
            watch.offset = float(message["now"]) - trio.current_time()
            shown.append(watch)
            continue
        if not shown:
            continue
        watch = shown[0]
        if kind == "subtree":  # a tree an actor owns: its supervisors' settings
            watch.view.extend([tuple(row) for row in message["outline"]])
            continue
        if kind == "live":  # the backlog is in: show the tree as it is now
            watch.catch_up()
            display.started(watch)
            nursery.start_soon(display.run, watch)
            live = True
        elif kind == "entry" and watch.log is not None:
            watch.log.append(entry_of(message))
            if live:
                display.events(watch, watch.catch_up())
        elif kind == "now":
            watch.offset = float(message["now"]) - trio.current_time()
        elif kind == "stacks":
            text = str(Stacks.from_json(message.get("stacks")))
            watch.sections = [("stacks (s again to refresh)", text.splitlines())]
            display.events(watch, [])
        elif kind == "end":
            return
    if not live:
        raise UsageError("the app stopped before it could be watched")


async def watch_app(attached: Attached, app: str | None, heading: str, live: bool) -> None:
    """Follow the app on a live display (keys: s, q) or as plain lines."""
    display: Display = (
        LiveDisplay("    s: stacks  q or Ctrl-C: stop watching")
        if live
        else PlainDisplay(_say, None, "Ctrl-C stops watching")
    )
    shown: list[Watch] = []
    refused: UsageError | None = None
    try:
        async with trio.open_nursery() as nursery:
            if live:
                nursery.start_soon(_keys, attached, nursery.cancel_scope)
            try:
                await follow(attached, app, heading, display, nursery, shown)
            except UsageError as exc:  # raised below: out of the nursery, it is not a group
                refused = exc
            nursery.cancel_scope.cancel()
    finally:
        if shown and shown[0].t0 is not None:
            display.finished(shown[0], shown[0].catch_up())
    if refused is not None:
        raise refused  # one line and status 2, as with --stacks


async def _keys(attached: Attached, quit_scope: trio.CancelScope) -> None:
    """``s`` asks for the stacks, ``q`` quits (the terminal in cbreak mode meanwhile)."""
    with _cbreak(sys.stdin.fileno()):
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        async with stdin:
            while True:
                data = await stdin.receive_some(64)
                if not data or b"q" in data:
                    quit_scope.cancel()
                    return
                if b"s" in data:
                    await attached.send({"op": "stacks"})


@contextmanager
def _cbreak(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _say(text: str) -> None:
    print(text, flush=True)


def run_command(args: argparse.Namespace) -> int:
    pid = args.pid
    if pid is None:
        apps = sorted(watchable_apps())
        if len(apps) != 1:
            running = f"running: {', '.join(map(str, apps))}" if apps else "none is running"
            raise UsageError(f"say which app: PID ({running})")
        pid = apps[0]
    live = sys.stdout.isatty() and sys.stdin.isatty() and os.environ.get("TERM") != "dumb"
    trio.run(_main, pid, args, live and not args.plain)
    return 0


async def _main(pid: int, args: argparse.Namespace, live: bool) -> None:
    attached = await Attached.connect(pid)
    async with attached.stream:
        if args.stacks:
            await attached.send({"op": "stacks", "app": args.app})
            async for message in attached.messages():
                if message.get("t") == "error":
                    raise UsageError(str(message.get("error")))
                print(Stacks.from_json(message.get("stacks")), end="")
                return
            raise UsageError(f"process {pid}'s app stopped before it answered")
        await watch_app(attached, args.app, f"otpmesh watch {pid}", live)
