"""A data-parallel group that survives a SIGKILL in the middle of an all-reduce.

    python examples/process_group.py

Two trainers form a gloo process group (``Mesh(process_group="gloo")``): each computes the
gradient of a small linear model on its shard of the batch and all-reduces it with
``torch.distributed``, as in any SPMD training loop. Rank 0 writes a checkpoint after every step.

Then rank 0 enters a step alone (it blocks in the all-reduce, waiting for rank 1) and rank 1 is
SIGKILLed. The group's supervisor (ONE_FOR_ALL) hears of the first exit (rank 1's SIGKILL or,
when gloo sees its peer go first, rank 0's failed all-reduce), stops the other, forks both
members afresh, forms the group again under epoch 2, and each new member restores the model from the
checkpoint in ``on_start``, the hook where a new incarnation gets its state back. Training
goes on, and both ranks hold the same weights.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from typing import Any

import trio

import otpmesh
from otpmesh import ONE_FOR_ALL, LogKind, Mesh


class Trainer(otpmesh.Actor):
    """One data-parallel rank of y = w x + b, fitted to y = 3x - 1."""

    def __init__(self, checkpoint: str) -> None:
        import torch

        torch.manual_seed(0)  # every rank starts from the same weights
        self.model = torch.nn.Linear(1, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.checkpoint = checkpoint
        self.step_count = 0

    async def on_start(self) -> None:
        # The restore hook: the group is already formed (otpmesh.group() works here), and every
        # member of the new epoch loads the same checkpoint, so the ranks agree again.
        import torch

        if os.path.exists(self.checkpoint):
            state = torch.load(self.checkpoint)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.step_count = state["step"]

    @otpmesh.endpoint
    def step(self, batch: list[float]) -> float:
        import torch
        import torch.distributed as dist

        group = otpmesh.group()
        x = torch.tensor(batch[group.rank :: group.size]).unsqueeze(1)
        loss = torch.nn.functional.mse_loss(self.model(x), 3 * x - 1)
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        for p in self.model.parameters():  # what DDP does, by hand
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= group.size
        self.optimizer.step()
        self.step_count += 1
        if group.rank == 0:
            state = {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "step": self.step_count,
            }
            torch.save(state, self.checkpoint + ".tmp")
            os.replace(self.checkpoint + ".tmp", self.checkpoint)  # never a torn checkpoint
        return float(loss)

    @otpmesh.endpoint
    def state(self) -> dict[str, Any]:
        group = otpmesh.group()
        w, b = (round(float(p.detach()), 4) for p in self.model.parameters())
        return {"epoch": group.epoch, "step": self.step_count, "w": w, "b": b, "pid": os.getpid()}


BATCH = [0.1 * i for i in range(-8, 8)]


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Mesh(
            "dp",
            Trainer,
            shape={"procs": 2},
            strategy=ONE_FOR_ALL,
            intensity=3,
            period=60.0,
            process_group="gloo",
            kwargs={"checkpoint": os.path.join(tmp, "dp.pt")},
        )
        async with otpmesh.start(tree) as app:
            dp = app.mesh("dp")
            for _ in range(3):
                losses = (await dp.step(BATCH)).values()
            print(f"3 steps, loss per rank {[round(x, 4) for x in losses]}")
            before = (await dp.state()).values()
            print(f"before: {before}")

            print("== rank 0 enters a step alone and blocks in all_reduce; rank 1 is SIGKILLed")
            async with trio.open_nursery() as nursery:

                async def blocked() -> None:
                    try:
                        await dp[0].step(BATCH)
                    except otpmesh.ActorDiedError as err:  # killed by its group's restart
                        print(f"  the blocked call fails: {err}")
                    except otpmesh.ActorError as err:  # gloo saw the peer go first (loaded host)
                        print(f"  the blocked call fails: dp/0 raised {err.type_name}")

                nursery.start_soon(blocked)
                await trio.sleep(0.5)
                os.kill(before[1]["pid"], signal.SIGKILL)
            await app.settled()
            for e in app.events.of_kind(LogKind.CHILD_EXITED):
                print(f"  {e.kind} {e.child_path}: {otpmesh.describe(e.reason)}")
            after = (await dp.state()).values()
            print(f"after:  {after}")
            print(
                f"new epoch: {after[0]['epoch']}, new processes: "
                f"{not {s['pid'] for s in after} & {s['pid'] for s in before}}"
            )
            for _ in range(3):
                losses = (await dp.step(BATCH)).values()
            final = (await dp.state()).values()
            print(f"3 more steps: {final}")
            same = len({(s["w"], s["b"]) for s in final}) == 1
            print(f"ranks agree: {same}; loss {losses[0]:.4f}")
    sys.stdout.flush()


if __name__ == "__main__":
    otpmesh.run(main)
