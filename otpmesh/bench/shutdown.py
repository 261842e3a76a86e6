"""Stopping actors stuck in plain-def endpoints: ``python -m otpmesh.bench shutdown`` prints one
JSON object (about 35 s): 4 actors, 5 s shutdown each, stopped as a Mesh (all at once) and as
an ordinary supervisor of the same workers (one at a time, newest first: how a Mesh stopped
before it stopped in parallel). (``python -m otpmesh.bench --shutdown`` is the older spelling.)"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any

import trio

import otpmesh

from .actor import BenchActor


async def _stop_stuck(tree: otpmesh.Supervisor | otpmesh.Mesh, paths: list[str]) -> float:
    """Seconds to stop `tree` (the end of its block, as after Ctrl-C) while every actor at
    `paths` is stuck in a plain-def endpoint."""

    async def stuck(path: str) -> None:
        with contextlib.suppress(otpmesh.OtpmeshError):
            await app.actor(path).stuck(600.0)

    async with otpmesh.start(tree) as app:
        async with trio.open_nursery() as calls:
            for path in paths:
                calls.start_soon(stuck, path)
            await trio.sleep(1.0)  # every call is in time.sleep by now
            calls.cancel_scope.cancel()
        started = time.perf_counter()
    return time.perf_counter() - started


async def shutdown_benchmark(shutdown: float = 5.0, actors: int = 4) -> dict[str, Any]:
    """Stopping `actors` actors stuck in plain-def endpoints, each with `shutdown` seconds:
    as a Mesh (stopped all at once) and as an ordinary supervisor of the same workers (one at
    a time, newest first: how a Mesh stopped before it stopped in parallel)."""
    mesh = otpmesh.Mesh("mesh", BenchActor, shape={"procs": actors}, shutdown=shutdown)
    ordered = otpmesh.Supervisor(
        "ordered",
        children=[otpmesh.Worker(str(r), BenchActor, shutdown=shutdown) for r in range(actors)],
    )
    ranks = [str(r) for r in range(actors)]
    return {
        "actors": actors,
        "shutdown_s": shutdown,
        "mesh_stop_s": round(await _stop_stuck(mesh, [f"mesh/{r}" for r in ranks]), 2),
        "ordered_stop_s": round(await _stop_stuck(ordered, [f"ordered/{r}" for r in ranks]), 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench shutdown", description=__doc__)
    parser.parse_args(argv)
    print(json.dumps(otpmesh.run(shutdown_benchmark), indent=2))


if __name__ == "__main__":
    main()
