"""How the controller learns that one of its local workers died, and why, as early as it can.

Four things tell it, whichever comes first: the worker's death lock (``_deathlock.py``: the
kernel releases it before it tears the process's memory down), its connection's end, its fork
server's report (it reaped the process) and its pidfd (a zombie: the kernel keeps its wait
status). Only the lock comes before the dead process's sockets close, so when it is first the
controller also tells the worker's peers (they would write into the old sockets, where nothing
reads) and ends its own connection after what the worker sent (``Connection.finish``). What a
death means for the process's actors, their exits and the calls still out, is the runtime's
(``Runtime._report_death``), run once from the connection's end whichever told first.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any

import trio

from .._node._node import Node
from ._deathlock import DeathWatch
from ._forkclient import ForkServer
from ._liveness import NOT_EXITING, describe_status, dying_status, zombie_status
from ._proc import Proc

log = logging.getLogger("otpmesh.runtime")


class Deaths:
    """The controller's ways of hearing of a local worker's death (see the module's docstring).
    `by_pid` is the runtime's index of its forked workers by pid (a process leaves it once its
    exit is known); `mark_exited(proc, reason)` records an exit and its reason."""

    def __init__(
        self,
        node: Node,
        forkserver: ForkServer,
        procs: dict[str, Proc],
        by_pid: dict[int, Proc],
        mark_exited: Callable[[Proc, str], None],
    ) -> None:
        self.node = node
        self.forkserver = forkserver
        self.procs = procs
        self.by_pid = by_pid
        self.mark_exited = mark_exited
        #: Watches every local worker's death lock: a death heard before the dead process's
        #: memory is torn down and its socket closes.
        self.watch = DeathWatch()
        self._token: trio.lowlevel.TrioToken | None = None

    def start(self) -> None:
        """In the runtime's trio run, before any worker says hello."""
        self._token = trio.lowlevel.current_trio_token()

    def stop(self) -> None:
        self.watch.stop()

    def hello(self, proc: Proc, payload: dict[str, Any]) -> None:
        """`proc`'s worker said hello: watch its lock if it says it holds it (one that does
        not is heard of from its connection's end)."""
        if proc.lock_page is None:
            return
        if payload.get("deathlock") is True:
            self.watch.watch(proc.lock_page, proc, self._heard)
        os.close(proc.lock_page)  # mapped by the watch now, or not watched
        proc.lock_page = None

    def _heard(self, proc: object) -> None:
        """From the DeathWatch's thread: `proc`'s death lock was released."""
        assert isinstance(proc, Proc) and self._token is not None
        try:
            self._token.run_sync_soon(self.dying, proc)
        except trio.RunFinishedError:
            pass

    def dying(self, proc: Proc) -> None:
        """`proc` is exiting (its lock says so; its memory is still being torn down). Unless it
        was asked to: take its exit status from the kernel now, tell its peers, and read what
        its connection holds before its pending calls fail and its actors' exits are reported
        (the usual path from its end of stream on, once). It is killed, to be sure: one that
        forged its word (alive, not exiting) dies for real (self-harm only). A status the
        kernel cannot give now (reaped already, or one that reads 0) comes with its fork
        server's report, as it would have without the lock; otherwise that report only
        confirms it."""
        if proc.noticed_by is not None or not proc.alive or proc.stop_asked or proc.conn is None:
            log.debug("%s (pid %d) released its death lock", proc.label(), proc.pid)
            return
        status = dying_status(proc.pid, self.forkserver.pid)
        # Killed to be sure: the lock also goes when the main thread alone ends (the fork
        # server signals only a child it has not reaped).
        self.forkserver.kill(proc.pid)
        if status == NOT_EXITING:
            status = signal.SIGKILL  # the wait status of its death, just now
        proc.noticed_by = "deathlock"
        log.debug("%s (pid %d) dying: noticed by its death lock", proc.label(), proc.pid)
        # Its peers first, in the order the controller sends: whatever it sends them after
        # this (a call, the restarted actor's address) finds the old process done there; and
        # how it died, so that a call of theirs into it fails with the words it fails with here.
        # One frame, encoded once, to each (a mass death costs each survivor one per death).
        # (A process its watchdog found an actor hung in is described from that report, by
        # the runtime: its peers ask for it, as they do when the status is not known yet.)
        how = None if status is None else proc.hang_reason or describe_status(status)
        told = None if how is None or proc.hung is not None else proc.death(how)
        news = {"addr": proc.addr, "reason": told}
        conns = [p.conn for p in self.procs.values() if p.alive and p.host is None]
        peers = [c for c in conns if c is not None and c is not proc.conn]
        self.node.sys_cast_all(peers, "peer_dying", news)
        self.node.peer_dying(news)
        if how is not None:
            self.mark_exited(proc, how)
        proc.conn.finish()

    def reaped(self, proc: Proc, reason: str) -> None:
        """Its fork server reaped `proc` and says why it ended."""
        if proc.noticed_by == "deathlock":  # reported then: this is only its reaping
            log.debug("%s (pid %d) reaped: %s", proc.label(), proc.pid, reason)
        proc.noticed_by = proc.noticed_by or "fork server"
        self.mark_exited(proc, reason)

    async def exit_status(self, proc: Proc) -> None:
        """Until `proc` is known to have exited, and why: from its fork server's report, or
        from the process itself, once it is a zombie (the kernel keeps its wait status until
        its parent reaps it), whichever comes first. On a busy machine the fork server's report
        can come well after (it must be scheduled to wake, reap and write); the status is the
        same. A closed connection means the process is exiting, not yet that it is a zombie:
        its pidfd says when."""
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:
            return  # reaped already: its fork server's report is on its way
        try:
            async with trio.open_nursery() as nursery:

                async def from_itself() -> None:
                    await trio.lowlevel.wait_readable(pidfd)
                    status = zombie_status(proc.pid, self.forkserver.pid)
                    if status is not None and self.by_pid.pop(proc.pid, None) is proc:
                        self.mark_exited(proc, describe_status(status))

                nursery.start_soon(from_itself)
                await proc.exited.wait()
                nursery.cancel_scope.cancel()
        finally:
            trio.lowlevel.notify_closing(pidfd)
            os.close(pidfd)
