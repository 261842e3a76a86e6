"""Benchmarks of actors that own meshes: ``python -m otpmesh.bench owned`` prints one JSON object.

Each figure sits beside its baseline, measured in the same run:

- an actor starting an owned proc mesh of 4 and spawning on it, to the first reply, beside the
  same done by the controller (the target is within 1.2x);
- a level-3 replica (``b/svc/replicas/0``, in a subtree its owner declared) SIGKILLed, to its
  next reply, beside a top-level worker SIGKILLed (target: within 1.2x);
- ``otpmesh.lookup(path)`` from inside an actor (one round trip to the controller), beside a
  plain call from the same actor to another actor.

Medians over several trials; timings on shared machines are noisy, compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import sys
import time
from typing import Any

import trio

import otpmesh

from .actor import BenchActor


class Owner(BenchActor):
    """Starts owned meshes on request, and owns a declared subtree of one replica."""

    async def on_start(self) -> None:
        spec = otpmesh.Mesh("replicas", BenchActor, shape={"procs": 1}, intensity=1000)
        self.sub = await otpmesh.context().start(spec)

    @otpmesh.endpoint
    async def owned_mesh_to_first_reply(self, procs: int) -> float:
        return await mesh_to_first_reply(procs)  # in an actor: the mesh is this actor's

    @otpmesh.endpoint
    async def replica(self) -> otpmesh.ActorRef:
        replicas: otpmesh.ActorMesh = self.sub.mesh()
        return replicas[0]

    @otpmesh.endpoint
    async def lookups(self, path: str, n: int) -> list[float]:
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            await otpmesh.lookup(path)
            samples.append(time.perf_counter() - started)
        return samples

    @otpmesh.endpoint
    async def calls(self, ref: otpmesh.ActorRef, n: int) -> list[float]:
        samples = []
        for i in range(n):
            started = time.perf_counter()
            await ref.echo(i)
            samples.append(time.perf_counter() - started)
        return samples


async def _until_new(ref: otpmesh.ActorRef, before: list[Any]) -> None:
    while True:
        try:
            if await ref.ident() != before:
                return
        except otpmesh.ActorDiedError:
            pass  # noticed the death before the restart
        await trio.sleep(0)


async def _sigkill_to_reply(ref: otpmesh.ActorRef, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        before = await ref.ident()
        started = time.perf_counter()
        os.kill(before[0], signal.SIGKILL)
        await _until_new(ref, before)
        samples.append(time.perf_counter() - started)
    return samples


async def mesh_to_first_reply(procs: int) -> float:
    """Seconds from asking for a proc mesh of `procs` to its first actor's first reply."""
    started = time.perf_counter()
    mesh_procs = await otpmesh.proc_mesh(procs=procs)
    mesh = await mesh_procs.spawn("m", BenchActor)
    await mesh[0].echo(0)
    elapsed = time.perf_counter() - started
    await mesh_procs.stop()
    return elapsed


async def owned_benchmark(trials: int = 5, kills: int = 10, lookups: int = 200) -> dict[str, Any]:
    # The kills are on purpose: keep their crash reports out, for this run only (a caller in
    # the same process, a test run among them, keeps its own logging).
    logger = logging.getLogger("otpmesh")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    tree = otpmesh.Supervisor(
        "b",
        intensity=1000,
        children=[otpmesh.Worker("svc", Owner), otpmesh.Worker("top", BenchActor)],
    )
    try:
        async with otpmesh.start(tree) as app:
            owner, top = app.actor("b/svc"), app.actor("b/top")
            await mesh_to_first_reply(4)  # warm: the fork server's first forks
            controller, owned = [], []
            for _ in range(trials):  # interleaved, so load drifts hit both alike
                controller.append(await mesh_to_first_reply(4))
                owned.append(await owner.owned_mesh_to_first_reply(4))
            replica = await owner.replica()
            level3 = await _sigkill_to_reply(replica, kills)
            level1 = await _sigkill_to_reply(top, kills)
            owner = app.actor("b/svc")
            looked = await owner.lookups("b/top", lookups)
            called = await owner.calls(top, lookups)
    finally:
        logger.setLevel(level)

    def ms(samples: list[float]) -> float:
        return round(statistics.median(samples) * 1e3, 2)

    def ratio(samples: list[float], baseline: list[float]) -> float:
        return round(statistics.median(samples) / statistics.median(baseline), 2)

    return {
        "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)},
        "mesh_4_to_first_reply_ms": {
            "from_the_controller_p50": ms(controller),
            "owned_by_an_actor_p50": ms(owned),
            "owned_vs_controller": ratio(owned, controller),
        },
        "sigkill_to_next_reply_ms": {
            "top_level_p50": ms(level1),
            "level_3_replica_p50": ms(level3),
            "level_3_vs_top": ratio(level3, level1),
        },
        "lookup_from_an_actor_us": {
            "p50": round(statistics.median(looked) * 1e6, 1),
            "actor_to_actor_call_p50": round(statistics.median(called) * 1e6, 1),
            "lookup_vs_call": ratio(looked, called),
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench owned", description=__doc__)
    parser.add_argument("--trials", type=int, default=5, help="mesh starts each way (default 5)")
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs each level (default 10)")
    parser.add_argument("--lookups", type=int, default=200, help="lookups and calls (default 200)")
    args = parser.parse_args(argv)
    print("python -m otpmesh.bench owned: measuring (about 20 s)", file=sys.stderr)
    result = otpmesh.run(owned_benchmark, args.trials, args.kills, args.lookups)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
