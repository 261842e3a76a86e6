"""Actor exits as the controller hears of them: from the worker that hosted the actor, or from
its process's lost connection (then with how the process died, which a peer's calls fail with
too); each passed to the actor's listener (its supervisor) and to the exit hooks. ``HearsExits``
is that part of ``Runtime`` (_controller_runtime.py; its state is the runtime's)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import trio

from .._core._exits import ProcessExit, describe
from .._core._reasons import SHUTDOWN, is_normal_exit
from .._node._node import Node
from .._wire._connection import Connection
from ._deaths import Deaths
from ._proc import Proc
from ._watchdog import hung_reason

log = logging.getLogger("otpmesh.runtime")

# How long a lost connection waits for the fork server's exit status before reporting.
EXIT_STATUS_WAIT = 1.0


class ExitListener(Protocol):
    """Hears of actor exits: first that one is coming, then the exit itself with its reason."""

    def actor_exiting(self, path: str, incarnation: int) -> None: ...
    def actor_exited(self, path: str, incarnation: int, reason: object) -> None: ...
    async def resolve(self, path: str) -> dict[str, Any]: ...


class HearsExits:
    """Every actor exit, and every worker's lost connection, heard and passed on."""

    node: Node
    procs: dict[str, Proc]
    cluster: Any
    nursery: trio.Nursery | None
    deaths: Deaths
    exit_listeners: dict[str, ExitListener]
    exit_hooks: list[Callable[[str, int, object], None]]
    _by_conn: dict[Connection, Proc]
    _host_of: dict[str, Proc]

    def exit_reason_of(self, proc: Proc, path: str) -> object:
        """Why `path`, hosted by the dead `proc`, exited."""
        if proc.shut_down:
            return SHUTDOWN
        hung = proc.hung
        if hung is not None:
            if hung.get("actor") in (None, path):
                return hung_reason(hung)
            return ProcessExit(proc.pid, f"was killed: {hung.get('actor')} hung in it")
        return ProcessExit(proc.pid, proc.exit_reason or "is gone")

    def _on_connection_lost(self, conn: Connection) -> bool:
        if self.cluster is not None and self.cluster.connection_lost(conn):
            return True
        proc = self.proc_on(conn)
        self._by_conn.pop(conn, None)
        if proc is None or self.nursery is None:
            return False
        proc.noticed_by = proc.noticed_by or "connection"
        self.nursery.start_soon(self._report_death, proc, conn)
        return True

    def proc_on(self, conn: Connection) -> Proc | None:
        """The worker process whose connection `conn` is (None: not one of ours)."""
        proc = self._by_conn.get(conn)
        if proc is None or proc.conn is not conn:
            # One whose connection was set without a HELLO here (adopted in a takeover).
            proc = next((p for p in self.procs.values() if p.conn is conn), None)
            if proc is not None:
                self._by_conn[conn] = proc
        return proc

    async def _report_death(self, proc: Proc, conn: Connection) -> None:
        # EOF comes first; the exit status follows from the fork server within milliseconds.
        with trio.move_on_after(EXIT_STATUS_WAIT):
            if proc.host is None and not proc.exited.is_set():
                await self.deaths.exit_status(proc)
            await proc.exited.wait()
        if proc.exit_reason is None:
            proc.exit_reason = f"lost its connection ({conn.close_reason})"
        self.node.fail_pending(conn, self._call_failure(proc))
        actors, proc.actors = proc.actors, {}
        for path in actors:
            if self._host_of.get(path) is proc:
                del self._host_of[path]
        # A process stopped on purpose (its host shut down with its cluster) ends its actors
        # with the normal 'shutdown'; one whose watchdog found an actor hung, with a Hung;
        # anything else is a process failure.
        for path, incarnation in actors.items():
            self.actor_exit(path, incarnation, self.exit_reason_of(proc, path))

    def _call_failure(self, proc: Proc) -> str:
        """How the dead `proc` died, in the words a call into it fails with: here, and in the
        peers that ask (``_death_of``)."""
        return describe(hung_reason(proc.hung)) if proc.hung else proc.death()

    async def _death_of(self, conn: Connection | None, addr: Any) -> str | None:
        """How the worker at `addr` died, for a peer that saw only its connection end (its
        calls into it then fail with the words they fail with here), once known: within
        EXIT_STATUS_WAIT, as here. None: no worker of this app had that address, or it lives."""
        if type(addr) is not str:
            return None
        # A scan, not an index: asked only by a caller that had calls out to a dead process.
        proc = next((p for p in self.procs.values() if p.addr == addr), None)
        if proc is None:
            return None
        with trio.move_on_after(EXIT_STATUS_WAIT):
            await proc.exited.wait()
        return None if proc.alive else self._call_failure(proc)

    async def _resolve_actor(self, conn: Connection | None, path: str) -> dict[str, Any]:
        listener = self.exit_listeners.get(path)
        if listener is None:
            return {"gone": f"{path} is not supervised by a running application"}
        return await listener.resolve(path)

    def _actor_exiting(self, payload: dict[str, Any]) -> None:
        listener = self.exit_listeners.get(payload["id"])
        if listener is not None:
            listener.actor_exiting(payload["id"], payload["incarnation"])

    def _actor_exited(self, payload: dict[str, Any]) -> None:
        # Inline in the connection reader: the exit is known before any later "dead" reply.
        path, incarnation = payload["id"], payload["incarnation"]
        proc = self._host_of.get(path)
        if proc is not None and proc.actors.get(path) == incarnation:
            del proc.actors[path]
            del self._host_of[path]
        else:  # not indexed (an adopted process's actors): look for it
            for proc in self.procs.values():
                if proc.actors.get(path) == incarnation:
                    del proc.actors[path]
        self.actor_exit(path, incarnation, payload["reason"])

    def actor_exit(self, path: str, incarnation: int, reason: object) -> None:
        listener = self.exit_listeners.get(path)
        if listener is not None:
            listener.actor_exited(path, incarnation, reason)
        elif not is_normal_exit(reason):
            log.warning("%s exited: %s", path, describe(reason))
        self.exited_hooks(path, incarnation, reason)

    def exited_hooks(self, path: str, incarnation: int, reason: object) -> None:
        for hook in self.exit_hooks:
            hook(path, incarnation, reason)
