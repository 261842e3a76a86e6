"""``.get()`` from a sync script beside ``await``: ``python -m otpmesh.bench sync`` prints one
JSON object.

- unicast round trips awaited in a trio run (``otpmesh.run``): the baseline;
- the same calls from a plain script with ``.get()``: each is carried to otpmesh's background
  run (a trio thread) and its result back to the waiting thread, so it costs two thread
  hand-offs more;
- pipelined calls (many in flight, ``nursery.start_soon(ref.echo, i)``), awaited.

Medians (and a rate) measured in this run; timings on shared machines are noisy, compare the
ratio, and run it again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import otpmesh

from ._baseline import time_calls
from .actor import BenchActor
from .core import pipelined_tasks


async def _awaited(calls: int, pipelined: int) -> tuple[list[float], float]:
    async with await otpmesh.proc_mesh(procs=1) as procs:
        mesh = await procs.spawn("bench", BenchActor)
        await time_calls(mesh[0].echo, min(200, calls))
        samples = await time_calls(mesh[0].echo, calls)
        rate, _ = await pipelined_tasks(mesh, pipelined)
        return samples, rate


def _got(ref: otpmesh.ActorRef, calls: int) -> list[float]:
    samples = []
    for i in range(calls):
        start = time.perf_counter()
        ref.echo(i).get()
        samples.append(time.perf_counter() - start)
    return samples


def sync_benchmark(calls: int = 2000, pipelined: int = 5000) -> dict[str, Any]:
    """Unicast p50 awaited in trio, then with ``.get()`` from this (plain) thread."""
    awaited, rate = otpmesh.run(_awaited, calls, pipelined)
    procs = otpmesh.proc_mesh(procs=1).get()
    ref = procs.spawn("bench", BenchActor).get()[0]
    _got(ref, min(200, calls))
    got = _got(ref, calls)
    procs.stop().get()
    await_p50, get_p50 = statistics.median(awaited), statistics.median(got)
    return {
        "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)},
        "unicast_await_us_p50": round(await_p50 * 1e6, 1),
        "unicast_get_us_p50": round(get_p50 * 1e6, 1),
        "get_vs_await": round(get_p50 / await_p50, 2),
        "pipelined_await_calls_per_s": {"in_flight": pipelined, "rate": round(rate)},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench sync", description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, metavar="N", help="calls per figure")
    parser.add_argument("--pipelined", type=int, default=5000, metavar="N", help="in flight")
    args = parser.parse_args(argv)
    print("python -m otpmesh.bench sync: measuring (about 10 s)", file=sys.stderr)
    print(json.dumps(sync_benchmark(args.calls, args.pipelined), indent=2))


if __name__ == "__main__":
    main()
