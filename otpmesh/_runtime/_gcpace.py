"""How often the garbage collector runs in otpmesh's processes.

Python collects its youngest generation every 700 net allocations of container objects, and
every tenth of those collections walks an older generation. A burst of calls in flight (a
pipeline of 10,000 calls to one actor keeps about 40 such objects alive per call: tasks,
frames, call groups) pays that again and again: the walks of older generations go over every
object the calls in flight hold. Measured on 2 cores with 10,000 pipelined calls, the
controller spent 95 µs of CPU per call, most of it collecting; with the youngest generation
collected every 20,000 allocations, 46 µs. Memory held back is bounded by that count.

Set in every worker (otpmesh's own processes) and, under ``otpmesh.run`` (a program that asked
for otpmesh's behaviour), in the controller. ``OTPMESH_GC_THRESHOLD`` sets the count; 0 keeps
Python's default.
"""

from __future__ import annotations

import gc
import os

#: Net container allocations between collections of the youngest generation.
THRESHOLD = int(os.environ.get("OTPMESH_GC_THRESHOLD", "20000"))


def pace() -> None:
    """Collect less often (see the module's docstring); the older generations keep their
    ratios to the youngest."""
    if THRESHOLD > 0:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(THRESHOLD, older, oldest)
