"""The controller finds a worker process by its connection or by an actor it hosts without
scanning every process: with a thousand workers, every actor exit, lost connection and worker
request scanned them all (a stop of 1,000 was quadratic)."""

from __future__ import annotations

from typing import Any

import trio

from otpmesh._runtime._controller_runtime import runtime
from otpmesh._runtime._proc import Proc


class _NoScan(dict[str, Proc]):
    """The runtime's process table, refusing to be walked once `armed`."""

    armed = False

    def values(self) -> Any:
        assert not self.armed, "the controller scanned every process for one lookup"
        return super().values()


def test_an_actor_exit_and_a_connection_find_their_process_without_a_scan() -> None:
    async def body() -> None:
        rt = await runtime()
        table = _NoScan()
        rt.procs = table
        procs = []
        for rank in range(1000):
            proc = Proc(rank=rank, coords={}, proc_id=f"t{rank}", index=rt._host_of)
            table[proc.proc_id] = proc
            procs.append(proc)
        target = procs[777]
        target.hosted("m/777", 3)
        conn: Any = object()  # a connection set without a HELLO here (adopted): found once
        target.conn = conn
        assert rt.proc_on(conn) is target
        heard: list[tuple[str, int]] = []
        rt.exit_hooks.append(lambda path, inc, reason: heard.append((path, inc)))
        table.armed = True
        assert rt.proc_on(conn) is target
        rt._actor_exited({"id": "m/777", "incarnation": 3, "reason": "normal"})
        assert target.actors == {} and heard == [("m/777", 3)]
        table.armed = False

    trio.run(body)
