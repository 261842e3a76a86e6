"""Chaos rollouts: 4 rollout actors under one-for-one keep serving while a ChaosMonkey kills them.

The controller keeps asking for rollouts until the monkey has thrown its faults: it crashes
actors and SIGKILLs their processes at random (reproducibly, from a seed). Every call either
returns or raises a clear error, and ``otpmesh.retry`` turns the ones that met a restart into
answers from the next incarnation.

    python examples/chaos_rollouts.py [--faults 20] [--rate 4] [--seed 1]
"""

from __future__ import annotations

import argparse
import random

import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, LogKind, Mesh, Supervisor, chaos


class Rollout(otpmesh.Actor):
    def __init__(self) -> None:
        self.rng = random.Random(otpmesh.context().rank)

    @otpmesh.endpoint
    async def rollout(self, prompt: int) -> float:
        await trio.sleep(0.005)  # pretend to sample a trajectory
        return prompt + self.rng.random()


def make_tree(intensity: int) -> Supervisor:
    rollouts = Mesh(
        "rollouts",
        Rollout,
        shape={"procs": 4},
        strategy=ONE_FOR_ONE,
        intensity=intensity,
        period=10.0,
    )
    return Supervisor("rl", intensity=intensity, period=10.0, children=[rollouts])


async def main(faults: int, rate: float, seed: int) -> dict[str, int]:
    counts = {"calls": 0, "answered": 0, "retried": 0, "failed": 0}
    # A fault restarts at most one actor: with intensity = faults the tree never gives up.
    async with otpmesh.start(make_tree(intensity=faults)) as app:
        rollouts = app.mesh("rl/rollouts").with_timeout(5.0)
        monkey = chaos.ChaosMonkey(
            app,
            seed=seed,
            rate=rate,
            targets=["rl/rollouts/*"],
            faults={"crash": 1, "kill": 1},
            max_faults=faults,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(monkey.run)  # returns after `faults` faults
            prompt = 0
            while len(monkey.injected) < faults:  # every call made runs to its end
                prompt += 1
                counts["calls"] += 1
                try:
                    await rollouts.rollout.choose(prompt)
                except (otpmesh.ActorDiedError, otpmesh.CallTimeoutError):
                    counts["retried"] += 1  # it met a restart: ask the next incarnation
                    try:
                        await otpmesh.retry(rollouts.rollout.choose, prompt)
                    except otpmesh.OtpmeshError:
                        counts["failed"] += 1
                        continue
                counts["answered"] += 1
        await app.settled()
        counts["faults"] = len(monkey.injected)
        counts["restarts"] = sum(
            1 for e in app.events if e.kind == LogKind.CHILD_STARTED and (e.incarnation or 0) > 1
        )
    print(
        f"{counts['faults']} faults injected, {counts['restarts']} restarts; "
        f"{counts['answered']} of {counts['calls']} calls answered "
        f"({counts['retried']} needed a retry, {counts['failed']} failed)"
    )
    return counts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=20, help="faults to throw, then stop")
    parser.add_argument("--rate", type=float, default=4.0, help="faults per second")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    otpmesh.run(main, args.faults, args.rate, args.seed)
