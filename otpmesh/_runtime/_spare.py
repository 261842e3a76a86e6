"""A spare worker: forked and started ahead of need, so a restart does not pay for it.

A SIGKILLed worker's slot needs a new process, and on the critical path of that restart the
fork server's ``fork()`` (copying the page tables of a process that imported torch: about
13 ms on this project's 2-core VMs) and the new worker's start (trio, its node, its watchdog)
cost more than everything else the controller does. So once a mesh is up, the controller asks
its fork server for one spare: a worker forked with the app's settings (the template: the
worker config less what belongs to one process), started as far as it can go without knowing
which process it will be, then blocked on its own socket. A spawn request whose template
matches is handed to the spare (its pipes, environment, proc id and one-time token, the same
way a fresh fork gets them) instead of forking; the fork server then forks the next spare when
the controller asks again, off the restart's critical path.

The spare runs no user code before its assignment: ``__main__`` is rebuilt, and actor classes
imported, only when an actor is spawned in it. While it waits it runs the restart's own path
once on an actor of otpmesh's (``_warmup.py``: a module imported by name, the actor started,
called and stopped), so that the restart pays none of the page faults a forked process takes
on its first writes to the fork server's pages there. What it did before (imports, its node's
listener) depends on nothing per slot; the slot's environment (``CUDA_VISIBLE_DEVICES``) is set
before anything can initialise CUDA.
"""

from __future__ import annotations

import array
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import trio

from .._core._dumpable import isolate_worker
from .._core._sandbox import wanted as sandbox_wanted

#: The worker config's fields that belong to one process, not to the app (_controller_runtime).
PER_PROCESS = ("proc", "token", "heartbeat_interval")  # the last: its timeout's (beat_interval)
#: How many spares the controller keeps (0 or 1): ``OTPMESH_SPARE_WORKERS=0`` turns them off,
#: for a program that never restarts a process and would rather not hold an idle one.
WANTED = 1 if os.environ.get("OTPMESH_SPARE_WORKERS", "1") != "0" else 0
#: Seconds from an actor's start to asking for the next spare: its first calls go first.
ASK_AFTER = 0.05
_MAX_PACKET = 1 << 20


def template(cfg: dict[str, Any]) -> dict[str, Any]:
    """What a worker config says about the app (a spare can start from it), not the process."""
    return {k: v for k, v in cfg.items() if k not in PER_PROCESS}


@dataclass(eq=False)
class _Spare:
    pid: int
    sock: socket.socket  # the fork server's end of the spare's private socket pair
    cfg: dict[str, Any]  # the template it started from
    page: int | None  # its death lock's page (_deathlock.py), for the controller once taken

    def close(self) -> None:
        self.sock.close()
        if self.page is not None:
            os.close(self.page)


class SparePool:
    """The fork server's spare (one at most), forked by `fork_spare(cfg)`: a callable that
    forks a spare from a template and returns its pid, the server's end of its socket and its
    death lock's page (or None)."""

    def __init__(
        self, fork_spare: Callable[[dict[str, Any]], tuple[int, socket.socket, int | None]]
    ) -> None:
        self._fork_spare = fork_spare
        self._spare: _Spare | None = None

    def fds(self) -> list[int]:
        """Descriptors a newly forked child must close (the server's end of the spare's socket,
        and the spare's page: a worker may write its own lock's word, never another's)."""
        spare = self._spare
        if spare is None:
            return []
        return [spare.sock.fileno()] + ([spare.page] if spare.page is not None else [])

    def want(self, cfg: dict[str, Any]) -> None:
        """Have a spare started from `cfg` (a template) ready; one from another is retired."""
        if self._spare is not None:
            if self._spare.cfg == cfg:
                return
            self.retire()
        pid, sock, page = self._fork_spare(cfg)
        self._spare = _Spare(pid, sock, cfg, page)

    def take(self, req: dict[str, Any], fds: list[int]) -> tuple[int, int | None] | None:
        """Hand spawn request `req` and its pipe ends `fds` to the spare if it fits: its pid and
        its lock's page (now the caller's), or None (no spare, one started for another
        template, or one that died: fork)."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        # A spare entered its sandbox, or not, as the server's environment said (_sandbox.py):
        # a slot whose OTPMESH_SANDBOX says otherwise gets a fresh fork.
        same_sandbox = sandbox_wanted({**os.environ, **req["env"]}) == sandbox_wanted()
        if spare.cfg != template(req["cfg"]) or not same_sandbox:
            self._spare = spare
            self.retire()
            return None
        assignment = {
            "env": req["env"],
            "cfg": {k: req["cfg"][k] for k in PER_PROCESS if k in req["cfg"]},
        }
        try:
            spare.sock.sendmsg(
                [msgpack.packb(assignment)],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
            )
        except OSError:
            # It died before its assignment (its exit report names a pid nobody knows).
            spare.close()
            return None
        spare.sock.close()
        return spare.pid, spare.page

    def exited(self, pid: int) -> None:
        """A child of the fork server exited: if it was the spare, there is none now."""
        if self._spare is not None and self._spare.pid == pid:
            self._spare.close()
            self._spare = None

    def retire(self) -> None:
        """Have no spare (it is SIGKILLed: it ran no user code)."""
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()  # it reads the end of its socket and exits
            try:
                os.kill(spare.pid, signal.SIGKILL)  # and if it is not reading yet, now
            except ProcessLookupError:
                pass


async def assignment(cfg: dict[str, Any]) -> bool:
    """In a worker: wait until it is given its process (a spare), then take it on: its output
    pipes, its slot's environment, its beat and control pipes, its proc id and token. True at
    once for a worker forked for its process; False for a spare the fork server retired."""
    fd = cfg.pop("spare_fd", None)
    if fd is None:
        return True
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    try:
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_PACKET, 4)
                break
            except BlockingIOError:
                continue
    finally:
        sock.close()
    if not data or len(fds) != 4:
        return False
    msg = msgpack.unpackb(data)
    out, err, heartbeat, control = fds
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    os.environ.update(msg["env"])
    isolate_worker()  # its slot's OTPMESH_DUMPABLE, read again now that it is set
    cfg.update(msg["cfg"], heartbeat_fd=heartbeat, control_fd=control)
    return True
