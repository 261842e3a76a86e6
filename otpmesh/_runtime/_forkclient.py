"""The client side of the fork server (_forkserver.py): start it, ask it to fork, hear its reports.

The controller runs one for the processes of its own host; a host agent (_agent.py) runs one for
the processes of its host. Both read a worker's output and heartbeats from pipes _workerpipes.py
makes.
"""

from __future__ import annotations

import array
import contextlib
import importlib.util
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import msgpack
import trio

from .._core._sandbox import warning_once
from .._wire._unproven import parent_pid
from ._forkstandby import dial_standby
from ._workerpipes import worker_pipes

log = logging.getLogger("otpmesh.forkserver")


def preload_modules() -> list[str]:
    """What the fork server imports before it forks (torch, when installed)."""
    configured = os.environ.get("OTPMESH_PRELOAD")
    if configured is not None:
        return [m for m in configured.split(",") if m]
    return ["torch"] if importlib.util.find_spec("torch") is not None else []


class ForkServer:
    """A running fork server. ``await nursery.start(fs.run)``, then ``spawn`` and ``kill``.

    `on_report` hears its reports: ``{"op": "spawned", "id", "pid"}`` and
    ``{"op": "exit", "pid", "reason"}``; `on_gone` is called once when it stops. A "spawned"
    report also carries the child's death lock page (_deathlock.py) as ``"page"``, a descriptor
    `on_report` takes by popping it (one left in the report is closed after it).
    """

    def __init__(
        self, on_report: Callable[[dict[str, Any]], None], on_gone: Callable[[], None]
    ) -> None:
        self._on_report = on_report
        self._on_gone = on_gone
        self._sock: trio.socket.SocketType | None = None
        self._raw: socket.socket | None = None
        self.ready = trio.Event()
        self.gone = False
        #: The fork server's pid once it runs (its children are the workers).
        self.pid: int | None = None

    def forked(self, pid: int) -> bool:
        """Whether `pid` is a child of this fork server (the kernel's word, read from /proc):
        one of its workers, known before the server's report of it arrives."""
        return self.pid is not None and parent_pid(pid) == self.pid

    async def run(
        self,
        standby: dict[str, Any] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start the fork server, hear its reports until it stops. With `standby` (_forkstandby.py)
        it outlives this controller for the grace period, for a standby to attach."""
        unconfined = warning_once()  # the workers it forks, said once (_core/_sandbox.py)
        if unconfined is not None:
            log.warning("%s", unconfined)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env["OTPMESH_FORKSERVER_FD"] = str(theirs.fileno())
        env["OTPMESH_PRELOAD"] = ",".join(preload_modules())
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "otpmesh._runtime._forkserver"],
            pass_fds=(theirs.fileno(),),
            start_new_session=True,  # Ctrl-C reaches the controller only; it stops the rest.
            env=env,
        )
        theirs.close()
        self.pid = process.pid
        if standby is not None:  # over the private socket pair: the secret never leaves it
            ours.send(msgpack.packb({"op": "takeover", **standby}))
        try:
            await self._serve(ours, task_status)
        finally:
            with trio.CancelScope(shield=True):
                await process.wait()
            self._on_gone()

    async def attach(
        self,
        path: str,
        secret: bytes,
        epoch: int,
        *,
        task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Take over the fork server at `path` at `epoch` (FencedError, OSError: dial_standby),
        then hear its reports until it stops; started with its live children's pids."""
        raw, reply = await dial_standby(path, secret, epoch)
        self.pid = int(reply["pid"])
        self.ready.set()
        try:
            await self._serve(raw, task_status, reply["children"])
        finally:
            self._on_gone()

    async def _serve(
        self, raw: socket.socket, task_status: trio.TaskStatus[Any], started: Any = None
    ) -> None:
        sock = trio.socket.from_stdlib_socket(raw)
        self._sock, self._raw = sock, raw
        task_status.started(started)
        try:
            while True:
                data, fds = await _recv_report(sock)
                if not data:
                    break
                msg = msgpack.unpackb(data)
                if msg["op"] == "ready":
                    self.ready.set()
                    continue
                if msg["op"] == "spawned" and fds:
                    msg["page"] = fds.pop()
                try:
                    self._on_report(msg)
                finally:
                    for fd in [*fds, *([msg["page"]] if "page" in msg else [])]:
                        os.close(fd)
        finally:
            self.gone = True
            self.ready.set()
            sock.close()

    def detach(self) -> None:
        """Let go of the fork server as a controller that dies does: with a takeover set up it
        waits out its grace period for a standby, its children running on."""
        if self._raw is not None and not self.gone:
            with contextlib.suppress(OSError):
                self._raw.shutdown(socket.SHUT_RDWR)

    def quit(self) -> None:
        """Ask the fork server to stop now (its controller is stopping in order: no takeover)."""
        if self._raw is not None and not self.gone:
            with contextlib.suppress(OSError):
                self._raw.send(msgpack.packb({"op": "quit"}))

    async def spawn(
        self, proc_id: str, env: dict[str, str], cfg: dict[str, Any]
    ) -> tuple[int, int, int, int]:
        """Fork a worker; return the read ends of its stdout, stderr and beat pipes, and the
        write end of its control pipe (_watchdog.py)."""
        assert self._sock is not None
        (out_r, err_r, beat_r, ctl_w), (out_w, err_w, beat_w, ctl_r) = worker_pipes()
        request = msgpack.packb({"op": "spawn", "id": proc_id, "env": env, "cfg": cfg})
        fds = array.array("i", [out_w, err_w, beat_w, ctl_r])
        try:
            await self._sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except BaseException:
            for fd in (out_r, err_r, beat_r, ctl_w):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, beat_w, ctl_r):
                os.close(fd)
        return out_r, err_r, beat_r, ctl_w

    def want_spare(self, cfg: dict[str, Any] | None) -> None:
        """Ask for a spare worker started from `cfg`, the app's part of a worker config
        (_spare.py); one the server has for it already is kept. None: no spare."""
        if self._raw is not None and not self.gone:
            try:
                self._raw.send(msgpack.packb({"op": "spare", "cfg": cfg}))
            except OSError:
                pass

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """Signal a worker (SIGKILL: the fork server, its parent, then reports the exit)."""
        if pid and self._raw is not None and not self.gone:
            try:
                self._raw.send(msgpack.packb({"op": "kill", "pid": pid, "sig": int(sig)}))
            except OSError:
                pass


async def _recv_report(sock: trio.socket.SocketType) -> tuple[bytes, list[int]]:
    """One report of the fork server, and the descriptors it came with (at most one)."""
    data, ancillary, _flags, _addr = await sock.recvmsg(
        1 << 16, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC
    )
    fds = array.array("i")
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
    return data, list(fds)
