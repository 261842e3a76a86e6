"""Progress deadlines and stacks: ``python -m otpmesh.bench hangs`` prints one JSON object
(about 40 s): how long past a 0.5 s deadline a hung actor answers again (restarted), for a
plain-def endpoint (its process killed) and an async one (cancelled); and ``app.stacks()``
over 100 worker processes. (``python -m otpmesh.bench --hangs`` is the older spelling.)"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any

import trio

import otpmesh

from ._baseline import ms
from ._restarts import until_answers
from .actor import BenchActor


async def _deadline_to_reply(endpoint: str, deadline: float, n: int) -> list[float]:
    """Seconds past `deadline` from a call that hangs to the restarted actor's first reply."""
    tree = otpmesh.Supervisor(
        "h",
        intensity=n + 1,
        period=3600,
        children=[otpmesh.Worker("w", BenchActor, progress_deadline=deadline)],
    )
    late = []
    async with otpmesh.start(tree) as app:
        w = app.actor("h/w")
        for _ in range(n):
            before = await w.ident()
            started = time.perf_counter()
            with contextlib.suppress(otpmesh.ActorDiedError):
                await (w.stuck(600.0) if endpoint == "stuck" else w.wedged())
            while await until_answers(w.ident) == before:
                await trio.sleep(0)
            late.append(time.perf_counter() - started - deadline)
    return late


async def _stacks_of(actors: int, n: int) -> list[float]:
    mesh = otpmesh.Mesh("s", BenchActor, shape={"procs": actors})
    times = []
    async with otpmesh.start(mesh) as app:
        for _ in range(n):
            started = time.perf_counter()
            stacks = await app.stacks()
            times.append(time.perf_counter() - started)
            assert len(stacks.actors) == actors
    return times


async def hangs_benchmark(n: int = 5, deadline: float = 0.5, actors: int = 100) -> dict[str, Any]:
    """Progress deadlines and stacks: how long past its deadline a hung actor answers again
    (restarted), for a plain-def endpoint (its process killed) and an async one (cancelled);
    and ``app.stacks()`` over `actors` worker processes."""
    sync = await _deadline_to_reply("stuck", deadline, n)
    async_ = await _deadline_to_reply("wedged", deadline, n)
    stacks = await _stacks_of(actors, n)
    return {
        "deadline_s": deadline,
        "trials": n,
        "sync_past_deadline_p50_ms": ms(sync),
        "async_past_deadline_p50_ms": ms(async_),
        "stacks_actors": actors,
        "stacks_p50_ms": ms(stacks),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench hangs", description=__doc__)
    parser.parse_args(argv)
    print(json.dumps(otpmesh.run(hangs_benchmark), indent=2))


if __name__ == "__main__":
    main()
