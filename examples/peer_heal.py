"""Peer heal: a SIGKILLed replica comes back with its peers' current weights, not its
constructor's, before it answers anything; with no peer left, the declared fallback runs.

A mesh of 4 rollout replicas holds weights (--mb megabytes of float32) that every replica
updates alike. Rank 2 is SIGKILLed; its replacement takes the weights from rank 0 (the lowest
rank that survived) over the tensor channel, inside its start, and its first reply already has
them. Then the whole mesh is killed: no replica survives, so each one runs the fallback the spec
declares (here: load the checkpoint the driver wrote).

    python examples/peer_heal.py [--mb 100]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

import torch

import otpmesh
from otpmesh import Heal, Mesh, Supervisor


class Rollout(otpmesh.Actor):
    def __init__(self, numel: int, checkpoint: str) -> None:
        self.weights = torch.zeros(numel)
        self.version = 0
        self.checkpoint = checkpoint
        self.origin = "constructor"

    @otpmesh.endpoint
    def state(self) -> dict[str, Any]:
        """What a restarted peer takes (served between two messages: never half an update)."""
        return {"weights": self.weights, "version": self.version}

    async def load_state(self, state: dict[str, Any]) -> None:
        self.weights, self.version = state["weights"], state["version"]
        self.origin = "a live peer"

    async def load_checkpoint(self) -> None:
        """The fallback when no peer is alive."""
        saved = torch.load(self.checkpoint)
        self.weights, self.version = saved["weights"], saved["version"]
        self.origin = "the checkpoint"

    @otpmesh.endpoint
    def set_weights(self, seed: int) -> None:
        self.weights = torch.randn(
            self.weights.shape, generator=torch.Generator().manual_seed(seed)
        )
        self.version += 1

    @otpmesh.endpoint
    def summary(self) -> str:
        return f"version {self.version}, sum {self.weights.sum().item():.3f}, from {self.origin}"


async def main(megabytes: int) -> None:
    checkpoint = os.path.join(tempfile.mkdtemp(), "weights.pt")
    numel = megabytes * (1 << 20) // 4
    torch.save({"weights": torch.ones(numel), "version": 100}, checkpoint)
    tree = Supervisor(
        "rl",
        intensity=3,
        children=[
            Mesh(
                "rollouts",
                Rollout,
                shape={"procs": 4},
                args=(numel, checkpoint),
                intensity=3,
                heal=Heal(fallback="load_checkpoint"),
            )
        ],
    )
    async with otpmesh.start(tree) as app:
        rollouts = app.mesh("rl/rollouts")
        await rollouts.set_weights(7)
        print("before:  ", (await rollouts[2].summary()))
        await otpmesh.chaos.kill(app, "rl/rollouts/2")  # SIGKILL one replica's process
        print("healed:  ", (await rollouts[2].summary()))  # its first reply: already healed
        await otpmesh.chaos.kill(app, "rl/rollouts")  # every replica at once: nobody to ask
        await app.settled()
        for rank, line in enumerate((await rollouts.summary()).values()):
            print(f"rank {rank}:  ", line)
    os.remove(checkpoint)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="weights per replica, in MB")
    otpmesh.run(main, parser.parse_args().mb)
