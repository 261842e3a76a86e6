"""``python -m otpmesh.bench monarch`` (about 30 s; ``--monarch`` is the older spelling): calls
through ``otpmesh.monarch`` beside the same calls in otpmesh's own API, in one run, on the same
kind of actor (asyncio endpoints, as a Monarch actor's are), with a trio actor's figures as the
floor (unicast, broadcast to 4, pipelined); and ``.get()`` from a thread beside ``await``.
Sequential calls: at most ``MOST_CALLS`` (1000) per figure, whatever ``--calls`` asks."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import trio

import otpmesh
from otpmesh import monarch

from .core import QUICK_HELP, add_arguments, iterations


class NativeEcho(otpmesh.Actor, loop="asyncio"):
    @otpmesh.endpoint(let_it_crash=False)  # Monarch's error policy, for a like-for-like call
    async def echo(self, x: Any) -> Any:
        return x


class TrioEcho(otpmesh.Actor):
    @otpmesh.endpoint
    async def echo(self, x: Any) -> Any:
        return x


class MonarchEcho(monarch.Actor):
    @monarch.endpoint
    async def echo(self, x: Any) -> Any:
        return x


async def _timed(call: Any, n: int) -> float:
    """The median seconds of `n` sequential awaits of ``call(i)``."""
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def _native_figures(procs: Any, cls: type[otpmesh.Actor], calls: int, n: int) -> list[float]:
    mesh = await procs.spawn(cls.__name__.lower(), cls)
    one = mesh[0]
    await _timed(one.echo, 50)
    unicast = await _timed(one.echo, calls)
    broadcast = await _timed(mesh.echo.call, max(50, calls // 4))
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one.echo, i)
    rate = n / (time.perf_counter() - start)
    await mesh.stop()
    return [unicast, broadcast, rate]


async def _monarch_figures(procs: Any, calls: int, n: int) -> tuple[list[float], float]:
    mesh = monarch.ProcMesh.from_otpmesh(procs).spawn("m", MonarchEcho)
    one = mesh.slice(procs=0)
    await _timed(one.echo.call_one, 50)
    unicast = await _timed(one.echo.call_one, calls)
    broadcast = await _timed(mesh.echo.call, max(50, calls // 4))
    start = time.perf_counter()
    futures = [one.echo.call_one(i) for i in range(n)]  # all sent at once, then read
    for future in futures:
        await future
    rate = n / (time.perf_counter() - start)

    def blocking() -> float:
        samples = []
        for i in range(calls):
            begin = time.perf_counter()
            one.echo.call_one(i).get()
            samples.append(time.perf_counter() - begin)
        return statistics.median(samples)

    get = await trio.to_thread.run_sync(blocking)
    await mesh.stop()
    return [unicast, broadcast, rate], get


async def monarch_benchmark(calls: int = 1000, pipelined: int = 5000) -> dict[str, Any]:
    """The figures, as one JSON-able dict."""
    procs = await otpmesh.proc_mesh(procs=4)
    trio_figures = await _native_figures(procs, TrioEcho, calls, pipelined)
    native = await _native_figures(procs, NativeEcho, calls, pipelined)
    through, get = await _monarch_figures(procs, calls, pipelined)
    await procs.stop()

    def row(figures: list[float]) -> dict[str, float]:
        return {
            "unicast_p50_us": round(figures[0] * 1e6, 1),
            "broadcast_4_p50_us": round(figures[1] * 1e6, 1),
            "pipelined_per_s": round(figures[2]),
        }

    return {
        "native_trio_actor": row(trio_figures),
        "native_asyncio_actor": row(native),
        "through_otpmesh_monarch": row(through),
        "monarch_vs_native_asyncio": {
            "unicast": round(through[0] / native[0], 2),
            "broadcast_4": round(through[1] / native[1], 2),
            "pipelined_rate": round(through[2] / native[2], 2),
        },
        "get_from_a_thread_vs_await_p50_us": {
            "get": round(get * 1e6, 1),
            "await": round(through[0] * 1e6, 1),
        },
    }


#: The most sequential calls per figure (the call suite's default is more).
MOST_CALLS = 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench monarch", description=__doc__)
    add_arguments(parser)
    parser.add_argument("--quick", action="store_true", help=QUICK_HELP)
    args = parser.parse_args(argv)
    calls, pipelined, _ = iterations(args)
    result = otpmesh.run(monarch_benchmark, min(calls, MOST_CALLS), pipelined)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
