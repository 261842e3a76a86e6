"""What every actor is doing now: ``app.stacks()``, and the signal ``otpmesh stacks`` sends.

Each worker's watchdog thread answers with the stacks of its actors' endpoints (it answers while
the worker's event loop is blocked in a plain-def endpoint; a stopped process, or one holding the
GIL in C code, does not answer within the timeout, and says so). Actors placed in the controller
are read directly. All processes are asked at once.

``otpmesh stacks PID`` sends SIGUSR2 to an app's controller; the app writes its stacks, as JSON,
to ``stacks_file(PID)`` (in a directory only its user can enter) and the command prints them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .._runtime import _stacks

if TYPE_CHECKING:
    from .._runtime._controller_runtime import Proc, Runtime

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
            {p: s for p, s in self.actors.items() if _under(p, path)},
            {o: t for o, t in self.threads.items() if any(_under(p, path) for p in o.split(", "))},
        )


def _under(path: str, prefix: str) -> bool:
    return not prefix or path == prefix or path.startswith(prefix.rstrip("/") + "/")


async def collect(rt: Runtime, path: str = "", timeout: float = ANSWER_TIMEOUT) -> Stacks:
    """Ask every process hosting an actor under `path`, all at once."""
    result = Stacks()
    procs = [p for p in list(rt.procs.values()) if any(_under(a, path) for a in p.actors)]

    async def ask(proc: Proc) -> None:
        hosted = sorted(a for a in proc.actors if _under(a, path))
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
        if _under(actor, path):
            result.actors[actor] = _stacks.actor_stack(cell)
    return result


def stacks_dir() -> Path:
    """Where apps of this user write their stacks: a directory only this user can enter."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    return base / f"otpmesh-{os.getuid()}"


def stacks_file(pid: int) -> Path:
    return stacks_dir() / f"stacks-{pid}.json"


def app_marker(pid: int) -> Path:
    """Present while the app whose controller is `pid` answers ``otpmesh stacks``."""
    return stacks_dir() / f"app-{pid}"


def is_private(directory: Path) -> bool:
    """Whether `directory` is a real directory of this user that nobody else may enter (what
    is in another user's look-alike must not be trusted: a planted marker would have
    ``otpmesh stacks`` signal a process that dies of SIGUSR2)."""
    try:
        st = directory.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def started_at(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc): with the pid, it names
    one process for good (a pid alone may be reused once that process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19].decode() if len(fields) > 19 else None


def is_running_app(pid: int) -> bool:
    """Whether `pid` is the controller that wrote its marker (not a later process that got
    the pid of an app that died without removing it)."""
    try:
        written = app_marker(pid).read_text().strip()
    except OSError:
        return False
    return bool(written) and written == started_at(pid)


def running_apps() -> list[int]:
    """The controllers of this user's apps that answer ``otpmesh stacks`` now."""
    if not is_private(stacks_dir()):
        return []
    pids = []
    for marker in stacks_dir().glob("app-*"):
        pid = marker.name.removeprefix("app-")
        if pid.isdigit() and is_running_app(int(pid)):
            pids.append(int(pid))
    return sorted(pids)


def _private_dir() -> Path:
    directory = stacks_dir()
    directory.mkdir(mode=0o700, exist_ok=True)
    if not is_private(directory):
        raise PermissionError(f"{directory} is not a private directory of this user")
    return directory


def write_stacks(stacks: Stacks, pid: int) -> Path:
    """Write `stacks` where ``otpmesh stacks PID`` reads them (atomically, mode 0600)."""
    directory = _private_dir()
    target = stacks_file(pid)
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
            _private_dir()
            marker = app_marker(pid)
            marker.touch(mode=0o600)
            marker.write_text(started_at(pid) or "")
        except OSError as exc:
            log.warning("otpmesh stacks will not reach this app: %s", exc)
            return
        try:
            async for _ in signals:
                try:
                    write_stacks(await collect(rt), pid)
                except OSError as exc:
                    log.error("cannot write the stacks otpmesh stacks asked for: %s", exc)
        finally:
            for path in (app_marker(pid), stacks_file(pid)):
                path.unlink(missing_ok=True)
