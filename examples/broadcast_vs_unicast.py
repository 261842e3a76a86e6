"""Broadcast vs unicast: the same endpoint called on the whole mesh and on one actor.

Shows what each returns and what each costs (median round trip over repeated calls), beside
fire-and-forget `.broadcast`, load-balanced `.choose` and as-they-arrive `.stream`.

    python examples/broadcast_vs_unicast.py [--calls N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import otpmesh


class Worker(otpmesh.Actor):
    def __init__(self) -> None:
        self.received = 0

    @otpmesh.endpoint
    async def square(self, x: int) -> int:
        self.received += 1
        return x * x

    @otpmesh.endpoint
    async def count(self) -> int:
        return self.received


async def _median_us(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for i in range(calls):
        start = time.perf_counter()
        await fn(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


async def main(calls: int) -> None:
    procs = await otpmesh.proc_mesh(procs=4)
    mesh = await procs.spawn("workers", Worker)

    everyone = await mesh.square(3)
    print(f"broadcast call  mesh.square(3)     -> {everyone!r}")
    print(f"unicast call    mesh[1].square(3)  -> {await mesh[1].square(3)!r}")
    print(f"chosen actor    mesh.square.choose -> {await mesh.square.choose(4)!r}")
    arrivals = [coords async for coords, _ in mesh.square.stream(5)]
    print(f"stream order    mesh.square.stream -> {arrivals}")
    await mesh.square.broadcast(6)  # fire-and-forget, FIFO before the next call
    print(f"after a fire-and-forget broadcast, messages per actor: {(await mesh.count()).values()}")

    unicast = await _median_us(mesh[0].square, calls)
    broadcast = await _median_us(mesh.square, calls)
    print(f"\nmedian round trip over {calls} calls:")
    print(f"  unicast to 1 actor     {unicast:8.0f} us")
    print(f"  broadcast to 4 actors  {broadcast:8.0f} us  ({broadcast / unicast:.1f}x unicast)")
    await procs.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    otpmesh.run(main, parser.parse_args().calls)
