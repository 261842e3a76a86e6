"""Data-parallel training: an all-for-one mesh of trainers, one per GPU.

    python supervisors/data_parallel.py            # each rank in a worker process of its own
    python supervisors/data_parallel.py --local    # every rank in this process, same supervision

Use it for DDP / FSDP / ZeRO-style training, where every rank holds a replica (or a shard) of the
same model and takes every step together with the others through collectives (all-reduce of the
gradients, all-gather of the parameters).

The tree::

    dp                  Mesh  gpus=4, ALL_FOR_ONE (= ONE_FOR_ALL), 3 restarts per 300 s
    └── 0 1 2 3         one Trainer actor per GPU

Why all-for-one: a rank cannot be replaced alone. The survivors of a crash are blocked in (or
about to enter) a collective that the dead rank will never join, and an NCCL communicator cannot
take in a new member: the process group has to be rebuilt by every rank. Their model state is
also one step ahead of whatever the new rank could load. So when one rank fails, the mesh stops
the others (newest first) and starts all of them again in rank order, and every rank resumes
from the same checkpoint, so the group agrees on the step and the weights.

With ``process_group="gloo"`` (or ``"nccl"``), ``make_group_tree`` makes the same mesh a real
``torch.distributed`` group: the trainers all-reduce their gradients themselves
(``GroupTrainer.train_step``), otpmesh forms the group at start and again, under a new epoch,
at every restart, and when a rank dies inside the all-reduce the others are killed at once
instead of hanging (docs/process-groups.md)::

    dp                  Mesh  gpus=4, ONE_FOR_ALL, process_group="gloo", 3 restarts per 300 s
    └── 0 1 2 3         one GroupTrainer per GPU, one torch.distributed group, epoch 1, 2, ...

A restart of the whole group counts as ONE restart against the intensity. The window is long
(300 s) because a group restart is expensive (checkpoint reload, communicator setup): three
failures in five minutes means something is wrong with the job, not with one step, and the mesh
gives up so that its parent (or you) can decide.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Awaitable, Iterable
from typing import Any, Literal

import otpmesh
from otpmesh import ALL_FOR_ONE, ONE_FOR_ALL, Mesh


class Trainer(otpmesh.Actor):
    """One data-parallel rank: a model replica (one scalar weight here) and its step count."""

    def __init__(self, checkpoint: str | None = None, lr: float = 0.5) -> None:
        self.checkpoint = checkpoint
        self.lr = lr
        self.step = 0
        self.weight = 0.0

    async def on_start(self) -> None:
        # Every rank resumes from the same checkpoint, so the group agrees after a restart.
        if self.checkpoint is not None and os.path.exists(self.checkpoint):
            with open(self.checkpoint) as f:
                state = json.load(f)
            self.step, self.weight = state["step"], state["weight"]

    @otpmesh.endpoint
    def grad(self, batch: list[float]) -> float:
        """This rank's gradient of a toy loss (weight - x)^2 / 2 on its shard of the batch."""
        ctx = otpmesh.context()
        shard = batch[ctx.rank :: ctx.shape["gpus"]]
        if any(math.isnan(x) for x in shard):
            raise FloatingPointError(f"NaN in rank {ctx.rank}'s shard of the batch")
        return sum(self.weight - x for x in shard) / len(shard)

    @otpmesh.endpoint
    def apply(self, mean_grad: float, checkpoint_every: int = 2) -> None:
        """Apply the all-reduced gradient; rank 0 writes a checkpoint every few steps."""
        self.weight -= self.lr * mean_grad
        self.step += 1
        if self.checkpoint and otpmesh.context().rank == 0 and self.step % checkpoint_every == 0:
            with open(self.checkpoint + ".tmp", "w") as f:
                json.dump({"step": self.step, "weight": self.weight}, f)
            os.replace(self.checkpoint + ".tmp", self.checkpoint)  # never a torn checkpoint

    @otpmesh.endpoint
    def state(self) -> tuple[int, float]:
        return self.step, round(self.weight, 4)


def make_tree(*, gpus: int = 4, checkpoint: str | None = None) -> Mesh:
    """`gpus` trainers that restart together; they resume from `checkpoint` (a JSON file)."""
    return Mesh(
        "dp",
        Trainer,
        shape={"gpus": gpus},
        strategy=ALL_FOR_ONE,
        intensity=3,
        period=300.0,
        kwargs={"checkpoint": checkpoint},
    )


class GroupTrainer(Trainer):
    """A rank of a process-group mesh: it all-reduces its own gradient (gloo or NCCL)."""

    @otpmesh.endpoint
    def train_step(self, batch: list[float], checkpoint_every: int = 2) -> float:
        """One whole step inside the group: gradient, all-reduce, apply; the mean gradient."""
        import torch
        import torch.distributed as dist

        grad = torch.tensor([self.grad(batch)])
        dist.all_reduce(grad)
        mean = float(grad.item()) / otpmesh.group().size
        self.apply(mean, checkpoint_every)
        return mean


def make_group_tree(*, gpus: int = 4, backend: str = "gloo", checkpoint: str | None = None) -> Mesh:
    """`make_tree`, as one torch.distributed group of GroupTrainers (needs worker processes)."""
    return Mesh(
        "dp",
        GroupTrainer,
        shape={"gpus": gpus},
        strategy=ONE_FOR_ALL,
        intensity=3,
        period=300.0,
        kwargs={"checkpoint": checkpoint},
        process_group=backend,
    )


tree = make_tree()


# ---- the demo ----------------------------------------------------------------------------------


async def train_step(dp: otpmesh.ActorMesh, batch: list[float]) -> None:
    """One synchronous step; the controller plays the all-reduce."""
    grads = await dp.grad(batch)
    await dp.apply(sum(grads) / len(grads))


async def fault(app: otpmesh.App, call: Awaitable[Any]) -> list[otpmesh.LogEntry]:
    """Make a call that crashes its actor; return the supervision events it caused."""
    since = len(app.events)
    try:
        await call
    except otpmesh.ActorError as err:
        print(f"  the caller gets ActorError from {err.actor}: {err.type_name}: {err.message}")
    await app.settled()  # the exit is handled and the restarts it caused are done
    return list(app.events)[since:]


def print_events(entries: Iterable[otpmesh.LogEntry]) -> None:
    """One line per supervision step: time since the first, kind, path, #incarnation, reason."""
    entries = list(entries)
    t0 = entries[0].time if entries else 0.0
    for e in entries:
        incarnation = "" if e.incarnation is None else f"#{e.incarnation}"
        reason = "" if e.reason is None else str(e.reason)
        ms = (e.time - t0) * 1000
        print(f"  {ms:7.1f} ms  {e.kind:<26}{e.child_path:<18}{incarnation:<4}{reason}".rstrip())


async def main(placement: Literal["procs", "local"] = "procs") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        job = make_tree(checkpoint=os.path.join(tmp, "dp.json"))
        async with otpmesh.start(job, placement=placement) as app:
            dp = app.mesh("dp")
            batch = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
            for _ in range(3):
                await train_step(dp, batch)
            # Rank 0 checkpoints at step 2; step 3 is lost when the group restarts.
            print(f"after 3 steps, (step, weight) per rank: {(await dp.state()).values()}")

            # A NaN stands in for any rank-local fault: an ECC error, a NCCL timeout, an OOM.
            print("== rank 2 fails: the whole group restarts, every rank from the checkpoint")
            poisoned = [*batch[:2], math.nan, *batch[3:]]
            print_events(await fault(app, train_step(dp, poisoned)))
            print(f"  (step, weight) per rank: {(await dp.state()).values()}")
            await train_step(dp, batch)
            print(f"one more step, all ranks together: {(await dp.state()).values()}")


if __name__ == "__main__":
    otpmesh.run(main, "local" if "--local" in sys.argv[1:] else "procs")
