"""A plain script, no event loop: every call is a Future, and ``.get()`` waits for it.

The first ``.get()`` starts otpmesh's background run (a trio thread) that hosts the controller;
at exit it stops in order and no worker outlives the script. A reduction sums the replies as
they arrive, and a supervised tree runs from sync code with ``start_background(...).get()``.

    python examples/sync_script.py
"""

from __future__ import annotations

import operator
import os

import otpmesh


class Counter(otpmesh.Actor):
    def __init__(self, start: int) -> None:
        self.count = start

    @otpmesh.endpoint
    async def incr(self, by: int) -> int:
        self.count += by
        return self.count

    @otpmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


def main() -> None:
    procs = otpmesh.proc_mesh(procs=2).get()
    counters = procs.spawn("counters", Counter, 10).get()
    print("incr on all:", counters.incr(1).get())  # a ValueMesh
    print("incr on one:", counters[0].incr(5).get())
    print("sum of all: ", counters.incr.reduce(operator.add, 0)(1).get())
    print("pids:", " ".join(str(p) for p in counters.pid.call().get()))

    tree = otpmesh.Supervisor("sync", children=[otpmesh.Worker("counter", Counter, args=(0,))])
    app = otpmesh.start_background(tree).get()
    print("tree counter:", app.actor("sync/counter").incr(2).get())
    print("tree pid:", app.actor("sync/counter").pid().get())
    app.stop().get()
    procs.stop().get()


if __name__ == "__main__":
    main()
