"""Thousands of calls in flight from one task: ``otpmesh.gather``.

Each ``ref.score(i)`` is a Future; ``gather`` sends them all at once and waits for every reply
in the one task (no task per call), results in argument order. A failing call among them is
raised once all have ended, or returned in its place with ``return_exceptions=True``.

    python examples/gather_calls.py [--calls N]
"""

from __future__ import annotations

import argparse
import time

import otpmesh


class Scorer(otpmesh.Actor):
    @otpmesh.endpoint(let_it_crash=False)  # a bad input fails its call, not the actor
    async def score(self, i: int) -> int:
        if i < 0:
            raise ValueError(f"no score for {i}")
        return i * i


async def main(calls: int) -> None:
    async with await otpmesh.proc_mesh(procs=1) as procs:
        ref = (await procs.spawn("scorer", Scorer))[0]
        start = time.perf_counter()
        scores = await otpmesh.gather(*(ref.score(i) for i in range(calls)))
        elapsed = time.perf_counter() - start
        print(f"{calls} calls, replies in order: {scores == [i * i for i in range(calls)]}")
        print(f"about {calls / elapsed:,.0f} calls/s (timings vary with the machine's load)")
        mixed = await otpmesh.gather(ref.score(2), ref.score(-1), return_exceptions=True)
        print("with return_exceptions:", [type(x).__name__ for x in mixed], mixed[0])
        try:
            await otpmesh.gather(ref.score(3), ref.score(-2))
        except otpmesh.ActorError as exc:
            print("raised once both ended:", exc.type_name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    otpmesh.run(main, parser.parse_args().calls)
