"""The GRPO actors: thin shells over ``task.py`` that add placement, weight sync and checkpoints.

Each is constructed with the run's config (a dict) and restarts cleanly: the learner's ranks from
their last checkpoint (in ``on_start``, the restore hook of a new epoch of their group), the
reward model from nothing, and a rollout from a live peer (``heal="peer"``: the weights of the
version the rollouts hold, which a rollout restarted after the iteration's weight sync needs
and the learner may no longer hold in an asynchronous pipeline).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

import otpmesh
from otpmesh.rdma import RDMABuffer, flat_parameters

from . import task

CHECKPOINT = "learner.pt"
Batch = dict[str, torch.Tensor]


# coordination: begin
class Learner(otpmesh.Actor):
    """One rank of the data-parallel learner (a process-group mesh): owns a replica of the policy
    and the optimizer and updates on its share of every batch, the gradients all-reduced with
    the other rank's. Rank 0 shares the weights (its parameters: views into one flat tensor
    registered with the tensor channel) and checkpoints after every update."""

    def __init__(self, config: dict[str, Any]) -> None:
        task.setup_torch()
        self.cfg = task.Config(**config)
        # With one learner it is a plain Worker; with more, a group formed before the constructor.
        self.rank = otpmesh.group().rank if self.cfg.learners > 1 else 0
        self.core = task.GRPOLearner(self.cfg, rank=self.rank, ranks=self.cfg.learners)
        self.history: list[dict[str, float]] = []  # the stats of every update applied, in order
        # recovery: begin
        self.checkpoint = Path(self.cfg.out_dir) / CHECKPOINT
        # recovery: end
        # The policy's parameters become views into one flat tensor, registered once per
        # epoch: every optimizer step (and the checkpoint's restore) changes the registered
        # weights in place, so there is nothing to publish after an update.
        self.flat = flat_parameters(self.core.policy)
        self.buffer = RDMABuffer(self.flat)

    # recovery: begin
    async def on_start(self) -> None:
        """The restore hook of a new epoch: every rank loads the same checkpoint, so the ranks
        agree on the weights and on the next update."""
        self.history = self._restore()

    # recovery: end
    @otpmesh.endpoint
    def weights(self) -> RDMABuffer:
        """A handle to the current weights (small): rollouts read the tensor with it."""
        return self.buffer

    @otpmesh.endpoint
    def update(
        self, iteration: int, batches: list[Batch], rewards: list[torch.Tensor]
    ) -> dict[str, float]:
        """Apply update `iteration` with the other rank (each on its share of the rows) and
        checkpoint; return the stats. The rollouts' next read sees the new weights."""
        # recovery: begin
        if iteration != len(self.history):
            raise ValueError(f"asked for update {iteration}; the next one is {len(self.history)}")
        # recovery: end
        stats = self.core.update(batches, rewards)  # all-reduces the gradients
        self.history.append(stats)
        # recovery: begin
        if self.rank == 0:
            self.save()
        # recovery: end
        return stats

    # coordination: end
    # recovery: begin
    @otpmesh.endpoint
    def stats(self, iteration: int) -> dict[str, float] | None:
        """The stats of update `iteration` if it was already applied, else None."""
        return self.history[iteration] if iteration < len(self.history) else None

    @otpmesh.endpoint
    def updates(self) -> int:
        """How many updates were applied: where a driver that took over resumes."""
        return len(self.history)

    async def on_stop(self, reason: object) -> None:
        self.buffer.drop()

    def save(self) -> None:
        """Write the checkpoint atomically: a SIGKILL mid-write leaves the previous one intact."""
        tmp = self.checkpoint.with_suffix(".tmp")
        torch.save({"history": self.history, **self.core.state_dict()}, tmp)
        os.replace(tmp, self.checkpoint)

    def _restore(self) -> list[dict[str, float]]:
        """Load the last checkpoint if there is one; return the history it holds."""
        if not self.checkpoint.exists():
            return []
        state = torch.load(self.checkpoint)
        self.core.load_state_dict(state)
        if self.rank == 0:
            print(
                f"resumed from {self.checkpoint} after {len(state['history'])} updates", flush=True
            )
        return list(state["history"])

    # recovery: end
    # coordination: begin


class RewardModel(otpmesh.Actor):
    """Scores the rollouts' batches (the task's digit-accuracy reward)."""

    def __init__(self, config: dict[str, Any]) -> None:
        task.setup_torch()

    @otpmesh.endpoint
    def score(self, batches: list[Batch]) -> list[torch.Tensor]:
        return [task.score(batch) for batch in batches]


class Rollout(otpmesh.Actor):
    """Samples one batch per iteration with the learner's weights of that iteration (its
    version), read once per version; a restarted rollout heals from a peer (``state``)."""

    def __init__(self, config: dict[str, Any]) -> None:
        task.setup_torch()
        self.cfg = task.Config(**config)
        self.policy = task.make_policy(self.cfg)
        # The parameters become views into one flat tensor: a read lands in them directly.
        self.flat = flat_parameters(self.policy)
        self.version = -1  # the iteration whose weights `flat` holds; -1: the initial policy

    # A read of weights whose owner has just died is not this rollout's fault: the error goes to
    # the controller, which re-runs the iteration; the rollout lives on.
    @otpmesh.endpoint(let_it_crash=False)
    async def sync(self, version: int, weights: RDMABuffer) -> bool:
        """Hold the weights of `version`: read them through the tensor channel straight into
        the policy's parameters (one copy; the learner's code does not run) unless held
        already. Returns whether it read."""
        if self.version == version:
            return False
        await weights.read_into(self.flat)
        self.version = version
        return True

    @otpmesh.endpoint(let_it_crash=False)
    async def generate(self, iteration: int, weights: RDMABuffer) -> Batch:
        """Sample this rank's batch for `iteration` with that iteration's weights (read first
        if this rollout does not hold them: it was restarted and no peer could heal it)."""
        await self._hold(iteration, weights)
        return task.generate(self.policy, self.cfg, iteration, otpmesh.context().rank)

    async def _hold(self, version: int, weights: RDMABuffer) -> bool:
        if self.version == version:
            return False
        await weights.read_into(self.flat)
        self.version = version
        return True

    # recovery: begin
    @otpmesh.endpoint
    def state(self) -> dict[str, Any]:
        """What a restarted peer heals from (``heal="peer"``): the weights and their version;
        the tensor travels over the tensor channel."""
        return {"version": self.version, "weights": self.flat}

    async def load_state(self, state: dict[str, Any]) -> None:
        self.flat.copy_(state["weights"])
        self.version = state["version"]
        print(f"healed from a peer at version {self.version}", flush=True)

    # recovery: end


# coordination: end
