"""How fast a process group comes back: SIGKILL one member of a 4-member gloo group while the
others are blocked in an all-reduce, and time until the re-formed group's next all-reduce.

    python -m otpmesh.bench pgroup [--trials 7] [--size 4]

Each trial is split into where the time goes (trio's clock, in the controller):

- detect: the SIGKILL until the controller has seen the member's exit and broken the epoch
  (killed the blocked peers and closed the store);
- terminate: until every process of the old epoch is gone and the new epoch opens;
- fork: until the fork server has started every member of the new epoch;
- rendezvous: until every member has joined the new group (store, gloo's full mesh);
- actors: until the members' actors have started (one after another, OTP's order) and the
  next all-reduce has returned.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
from collections.abc import Sequence
from typing import Any

import trio

import otpmesh
from otpmesh import ONE_FOR_ALL, Mesh, Supervisor

PHASES = ("detect", "terminate", "fork", "rendezvous", "actors")


class Member(otpmesh.Actor):
    """A group member that all-reduces one number."""

    @otpmesh.endpoint
    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value])
        dist.all_reduce(tensor)
        return float(tensor.item())

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


async def _trial(app: otpmesh.App, group: Any) -> dict[str, float]:
    mesh = app.mesh("bench/group")
    size = len(mesh)
    victim = (await mesh[size - 1].pid()) if size > 1 else 0

    async def blocked(rank: int) -> None:
        try:
            await mesh[rank].all_reduce(1.0)
        except otpmesh.OtpmeshError:
            pass  # freed: its process was killed with the group

    async with trio.open_nursery() as nursery:
        for rank in range(size - 1):
            nursery.start_soon(blocked, rank)
        await trio.sleep(0.3)  # let them enter the collective
        before = group.history[-1]
        killed = trio.current_time()
        os.kill(victim, signal.SIGKILL)
    while True:  # a call made while the group restarts waits for it
        try:
            total = (await mesh.all_reduce(1.0)).values()
            break
        except otpmesh.ActorDiedError:
            await trio.sleep(0.01)  # sent in the instant before the exit was known
    done = trio.current_time()
    if total != [float(size)] * size:
        raise RuntimeError(f"all-reduce of the new group gave {total}")
    new = group.history[-1]
    return {
        "detect": before.broken - killed,
        "terminate": new.old_dead - before.broken,
        "fork": new.forked - new.old_dead,
        "rendezvous": new.joined - new.forked,
        "actors": done - new.joined,
        "total": done - killed,
    }


async def run(trials: int, size: int) -> list[dict[str, float]]:
    from .._controller._app import context

    tree = Supervisor(
        "bench",
        children=[
            Mesh(
                "group",
                Member,
                shape={"procs": size},
                strategy=ONE_FOR_ALL,
                intensity=trials + 1,
                period=3600.0,
                process_group="gloo",
            )
        ],
    )
    results = []
    async with otpmesh.start(tree) as app:
        group = context(app).placement.groups["bench/group"]  # type: ignore[attr-defined]
        await app.mesh("bench/group").all_reduce(1.0)  # warm: the first epoch is up
        for _ in range(trials):
            results.append(await _trial(app, group))
            await app.settled()
    return results


def report(results: list[dict[str, float]]) -> str:
    return table(results, (*PHASES, "total"))


def table(results: list[dict[str, float]], rows: Sequence[str], heading: str = "phase") -> str:
    """Each row's median, min and max over the trials, in milliseconds (from seconds)."""
    width = max(12, len(heading) + 2, *(len(row) + 2 for row in rows))
    lines = [f"{heading:<{width}}{'p50 ms':>9}{'min ms':>9}{'max ms':>9}"]
    for row in rows:
        values = [r[row] * 1000 for r in results]
        lines.append(
            f"{row:<{width}}{statistics.median(values):9.1f}{min(values):9.1f}{max(values):9.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m otpmesh.bench pgroup",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--size", type=int, default=4)
    args = parser.parse_args(argv)
    os.environ.setdefault("OTPMESH_PRELOAD", "torch,torch.distributed")
    results = otpmesh.run(run, args.trials, args.size)
    print(f"SIGKILL of 1 of {args.size} gloo members blocked in all_reduce -> next all_reduce")
    print(f"({len(results)} trials)")
    print(report(results))


if __name__ == "__main__":
    main()
