"""Workers dialing back to the controller: each HELLO checked (its one-time token, its pid, the
kernel's word on the peer) and registered, or refused with nothing sent. ``ChecksHellos`` is
that part of ``Runtime`` (_controller_runtime.py; its state is the runtime's)."""

from __future__ import annotations

from typing import Any

import trio

from .._node._node import Node
from .._wire._connection import Connection
from ._deaths import Deaths
from ._proc import Proc, hello_peer, hello_refusal, peer_refusal
from ._statedir import TakeoverState

#: How long a worker has to dial back (its HELLO) once it is asked for.
SPAWN_TIMEOUT = 60.0


class ChecksHellos:
    """Which connection is which worker, proved by its HELLO."""

    node: Node
    procs: dict[str, Proc]
    cluster: Any
    nursery: trio.Nursery | None
    takeover: TakeoverState | None
    deaths: Deaths
    _by_conn: dict[Connection, Proc]

    def _on_hello(self, conn: Connection, payload: Any) -> None:
        if isinstance(payload, dict) and "agent" in payload and self.cluster is not None:
            self.cluster.on_agent_hello(conn, payload)
            return
        if isinstance(payload, dict) and "lifeline" in payload and self.cluster is not None:
            self.cluster.on_lifeline_hello(conn, payload)
            return
        proc = self.procs.get(str(payload.get("proc"))) if isinstance(payload, dict) else None
        if (
            proc is not None
            and proc.host is None
            and not proc.forked.is_set()
            and self.nursery is not None
            and hello_refusal(proc, payload) is None
        ):
            # The right token, but its fork server's report (the pid to check it against) is
            # still on its way: decide once it came. A wrong token is refused at once, below.
            self.nursery.start_soon(self._hello_once_forked, conn, proc, payload)
            return
        self._check_hello(conn, proc, payload)

    async def _hello_once_forked(self, conn: Connection, proc: Proc, payload: Any) -> None:
        with trio.move_on_after(SPAWN_TIMEOUT):
            await proc.forked.wait()
        self._check_hello(conn, proc, payload)

    def _check_hello(self, conn: Connection, proc: Proc | None, payload: Any) -> None:
        """Register `proc`'s worker on `conn`, or refuse the HELLO without touching `proc`:
        nothing is sent to the sender, its connection alone is closed, the token stays unused."""
        why = hello_refusal(proc, payload) or peer_refusal(conn, proc)
        if why is not None or proc is None:
            name = payload.get("proc") if isinstance(payload, dict) else None
            self.node.refusals.refused(hello_peer(conn), f"worker HELLO for {name!r}: {why}")
            conn.abort(f"refused: {why}")
            return
        proc.token = None  # used: a replay of this HELLO, on any connection, is refused
        proc.conn = conn
        self._by_conn[conn] = proc
        proc.addr = payload["addr"]
        proc.pid = proc.pid or payload["pid"]
        self.node.register(proc.addr, conn)
        if proc.host is not None:
            self.node.relays[proc.addr] = proc.host.conn
        if self.takeover is not None:
            self.takeover.proc_started(proc)
        self.deaths.hello(proc, payload)
        proc.ready.set()
