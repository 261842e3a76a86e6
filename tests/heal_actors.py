"""Actor classes for the peer-heal tests (importable by worker processes)."""

from __future__ import annotations

import os
import signal
from typing import Any

import torch

import otpmesh


class Replica(otpmesh.Actor):
    """A replica of a data-parallel or rollout mesh: parameters every member updates alike."""

    def __init__(self, numel: int, checkpoint: str = "") -> None:
        self.params = torch.zeros(numel)
        self.step = 0
        self.checkpoint = checkpoint
        self.restored_from = "constructor"
        self.served = 0  # endpoint calls served: a heal must come before the first
        self.served_when_loaded: int | None = None
        self.die_in_state = False

    @otpmesh.endpoint
    def state(self) -> dict[str, Any]:
        if self.die_in_state:  # a peer that dies while it is asked (the sender's side goes)
            os.kill(os.getpid(), signal.SIGKILL)
        return {"params": self.params, "step": self.step}

    async def load_state(self, state: dict[str, Any]) -> None:
        self.params, self.step = state["params"], state["step"]
        self.restored_from = "peer"
        self.served_when_loaded = self.served

    async def load_checkpoint(self) -> None:
        self.params, self.step = torch.load(self.checkpoint).values()
        self.restored_from = "checkpoint"
        self.served_when_loaded = self.served

    @otpmesh.endpoint
    def train(self, seed: int) -> int:
        """One step: the same update on every replica (seeded), so they stay equal."""
        self.served += 1
        generator = torch.Generator().manual_seed(seed)
        self.params.add_(torch.randn(self.params.shape, generator=generator))
        self.step += 1
        return self.step

    @otpmesh.endpoint
    def snapshot(self) -> dict[str, Any]:
        """Its parameters (large: over the tensor channel) and how it got them."""
        self.served += 1
        return {
            "params": self.params,
            "step": self.step,
            "restored_from": self.restored_from,
            "served_when_loaded": self.served_when_loaded,
        }

    @otpmesh.endpoint
    def how(self) -> tuple[str, int, int | None]:
        self.served += 1
        return self.restored_from, self.step, self.served_when_loaded

    @otpmesh.endpoint
    def fail_when_asked_for_state(self) -> None:
        self.die_in_state = True


class BadLoad(Replica):
    """A replica whose load_state fails halfway: its start must fail, never serve."""

    async def load_state(self, state: dict[str, Any]) -> None:
        self.params = state["params"]  # half-loaded...
        raise RuntimeError("load_state failed halfway")


class NoState(otpmesh.Actor):
    async def load_state(self, state: Any) -> None:
        pass


class NoLoad(otpmesh.Actor):
    @otpmesh.endpoint
    def state(self) -> int:
        return 0


class SyncLoad(NoLoad):
    def load_state(self, state: Any) -> None:  # not async: refused
        pass
