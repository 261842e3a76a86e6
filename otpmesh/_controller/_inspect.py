"""What every actor is doing now: ``app.stacks()``, and the signal ``otpmesh stacks`` sends.

Each worker's watchdog thread answers with the stacks of its actors' endpoints (it answers while
the worker's event loop is blocked in a plain-def endpoint; a stopped process, or one holding the
GIL in C code, does not answer within the timeout, and says so). Actors placed in the controller
are read directly. All processes are asked at once.

``otpmesh stacks PID`` sends SIGUSR2 to an app's controller; the app writes its stacks, as JSON,
to ``stacks_file(directory, PID)`` (in a directory only its user can enter, ``_stacksdir.py``)
and the command prints them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .._runtime import _stacks
from ._stacksdir import is_private, make_private_dir, trusted_dirs

if TYPE_CHECKING:
    from .._runtime._controller_runtime import Runtime
    from .._runtime._proc import Proc

log = logging.getLogger("otpmesh")

#: How long one process has to answer.
ANSWER_TIMEOUT = 1.0


@dataclass
class Stacks:
    """The stacks of the actors under a path: ``actors`` maps each running actor's path to what
    it is doing ('idle', or its endpoint's frames, innermost first); ``threads`` maps a
    process's actors to the stacks of its other threads, where it has any."""

    actors: dict[str, str] = field(default_factory=dict)
    threads: dict[str, str] = field(default_factory=dict)

    def groups(self) -> list[tuple[str, list[str]]]:
        """Actors with identical stacks together: (stack, paths), the largest group first."""
        by_stack: dict[str, list[str]] = {}
        for path in sorted(self.actors):
            by_stack.setdefault(self.actors[path], []).append(path)
        return sorted(by_stack.items(), key=lambda item: (-len(item[1]), item[1][0]))

    def __str__(self) -> str:
        out: list[str] = []
        for stack, paths in self.groups():
            count = f"{len(paths)} actors" if len(paths) > 1 else "1 actor"
            out.append(f"{count}: {', '.join(paths)}")
            out.extend(f"  {line}" for line in stack.splitlines())
            out.append("")
        for owner, text in sorted(self.threads.items()):
            out.append(f"other threads of {owner}:")
            out.extend(f"  {line}" for line in text.splitlines())
            out.append("")
        return "\n".join(out).rstrip() + "\n" if out else "no running actors\n"

    def to_json(self) -> dict[str, Any]:
        return {"actors": self.actors, "threads": self.threads}

    @classmethod
    def from_json(cls, data: Any) -> Stacks:
        if not isinstance(data, dict):
            raise ValueError("not a stacks file")
        actors, threads = data.get("actors", {}), data.get("threads", {})
        if not (isinstance(actors, dict) and isinstance(threads, dict)):
            raise ValueError("not a stacks file")
        return cls(
            {str(k): str(v) for k, v in actors.items()},
            {str(k): str(v) for k, v in threads.items()},
        )

    def under(self, path: str) -> Stacks:
        """Only the actors at or below `path`."""
        return Stacks(
            {p: s for p, s in self.actors.items() if under(p, path)},
            {o: t for o, t in self.threads.items() if any(under(p, path) for p in o.split(", "))},
        )


def under(path: str, prefix: str) -> bool:
    """Whether `path` is `prefix` or below it (every path is under the empty prefix)."""
    return not prefix or path == prefix or path.startswith(prefix.rstrip("/") + "/")


async def collect(rt: Runtime, path: str = "", timeout: float = ANSWER_TIMEOUT) -> Stacks:
    """Ask every process hosting an actor under `path`, all at once."""
    result = Stacks()
    procs = [p for p in list(rt.procs.values()) if any(under(a, path) for a in p.actors)]

    async def ask(proc: Proc) -> None:
        hosted = sorted(a for a in proc.actors if under(a, path))
        answer = await rt.request_stacks(proc, timeout)
        if isinstance(answer, str):
            for actor in hosted:
                result.actors[actor] = f"(no answer: its process (pid {proc.pid}) {answer})"
            return
        actors = answer.get("actors", {})
        for actor in hosted:
            result.actors[actor] = str(actors.get(actor, "(not running in its process)"))
        threads = str(answer.get("threads", ""))
        if threads:
            result.threads[", ".join(hosted)] = threads

    async with trio.open_nursery() as nursery:
        for proc in procs:
            nursery.start_soon(ask, proc)
    for actor, cell in list(rt.node.actors.items()):
        if under(actor, path):
            result.actors[actor] = _stacks.actor_stack(cell)
    return result


def stacks_file(directory: Path, pid: int) -> Path:
    return directory / f"stacks-{pid}.json"


def app_marker(directory: Path, pid: int) -> Path:
    """Present in `directory` while the app whose controller is `pid` answers ``otpmesh
    stacks``."""
    return directory / f"app-{pid}"


def started_at(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc): with the pid, it names
    one process for good (a pid alone may be reused once that process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19].decode() if len(fields) > 19 else None


def app_dir(pid: int) -> Path | None:
    """The trusted directory (``_stacksdir.py``) where `pid` left the marker of a running app,
    or None: not an app, or a later process that got the pid of an app that died without
    removing its marker."""
    for directory in trusted_dirs():
        try:
            written = app_marker(directory, pid).read_text().strip()
        except OSError:
            continue
        if written and written == started_at(pid):
            return directory
    return None


def running_apps() -> list[int]:
    """The controllers of this user's apps that answer ``otpmesh stacks`` now."""
    pids = set()
    for directory in trusted_dirs():
        for marker in directory.glob("app-*"):
            pid = marker.name.removeprefix("app-")
            if pid.isdigit() and app_dir(int(pid)) is not None:
                pids.add(int(pid))
    return sorted(pids)


def write_stacks(stacks: Stacks, directory: Path, pid: int) -> Path:
    """Write `stacks` where ``otpmesh stacks PID`` reads them (atomically, mode 0600)."""
    if not is_private(directory):
        raise PermissionError(f"{directory} is no longer a private directory of this user")
    target = stacks_file(directory, pid)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".stacks-")
    with os.fdopen(fd, "w") as f:
        json.dump(stacks.to_json(), f)
    os.replace(tmp, target)
    return target


async def serve_signal(rt: Runtime) -> None:
    """Answer SIGUSR2 (``otpmesh stacks PID``) for as long as the app runs, unless the program
    has its own handler for it. Needs the main thread (signals go there)."""
    if threading.current_thread() is not threading.main_thread():
        return  # signals reach the main thread only (an app in a test's helper thread)
    if signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL:
        return
    receiver = trio.open_signal_receiver(signal.SIGUSR2)
    pid = os.getpid()
    with receiver as signals:
        try:
            directory, why = make_private_dir()
            marker = app_marker(directory, pid)
            marker.touch(mode=0o600)
            marker.write_text(started_at(pid) or "")
        except OSError as exc:
            log.warning("otpmesh stacks will not reach this app: %s", exc)
            return
        if why is not None:
            log.warning(
                "%s; otpmesh stacks uses %s instead (remove the other one, as its owner or "
                "root, to use the usual place again)",
                why,
                directory,
            )
        try:
            async for _ in signals:
                try:
                    write_stacks(await collect(rt), directory, pid)
                except OSError as exc:
                    log.error("cannot write the stacks otpmesh stacks asked for: %s", exc)
        finally:
            for path in (app_marker(directory, pid), stacks_file(directory, pid)):
                path.unlink(missing_ok=True)
