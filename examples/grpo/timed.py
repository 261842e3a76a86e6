"""The GRPO actors with clocks, for ``python -m otpmesh.bench rl``: the same actors and the same
controller loop (``train.run_iteration``), each actor timing its own phases.

A rollout times its weight read (the sync: ``read_into`` its ``flat_parameters``) apart from its
sampling, the reward actor its scoring, the learner its update apart from its checkpoint. Each
incarnation also notes when it was born: when its process started (from ``/proc``), when this
module was imported in it, when its constructor began and when it was ready (constructor and
``on_start`` done), so the benchmark can say where a restart's time goes.

``arm`` makes the next call block at a chosen point until the benchmark SIGKILLs the actor: a
rollout after its weight read (mid-generate), the learner after its update's compute and before
its checkpoint (mid-update). The actor writes the file it is given once it blocks, so the kill
lands there, never after a guessed sleep.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import trio

import otpmesh
from otpmesh.rdma import RDMABuffer

from . import task
from .actors import Batch, Learner, RewardModel, Rollout

IMPORTED = time.time()  # in each process: when this module was imported there


def process_started() -> float:
    """When this process started, in wall-clock seconds (to the kernel's tick, 10 ms)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[19])  # starttime: field 22, counted from the state field (3)
    # Its age from the uptime (to 10 ms): /proc/stat's boot time is rounded to a second.
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


class Clock:
    """One incarnation's birth times and phase durations (seconds), by iteration."""

    def __init__(self, began: float) -> None:
        self.born = {"process": process_started(), "imported": IMPORTED, "init": began}
        self.phases: dict[int, dict[str, float]] = {}
        self.armed: str | None = None  # the file to write before blocking, once

    def ready(self) -> None:
        self.born["ready"] = time.time()

    def record(self, iteration: int, **seconds: float) -> None:
        self.phases.setdefault(iteration, {}).update(seconds)

    def take_armed(self) -> str | None:
        armed, self.armed = self.armed, None
        return armed

    def report(self) -> dict[str, Any]:
        return {"born": self.born, "phases": {str(k): v for k, v in self.phases.items()}}


class Clocked:
    """What every timed actor adds: ``arm`` its next call to block, and read its clock."""

    clock: Clock

    @otpmesh.endpoint
    def arm(self, held: str) -> None:
        self.clock.armed = held

    @otpmesh.endpoint
    def clocks(self) -> dict[str, Any]:
        return self.clock.report()


class TimedRollout(Clocked, Rollout):
    """A rollout timing its weight read apart from its sampling; armed, it blocks between."""

    def __init__(self, config: dict[str, Any]) -> None:
        began = time.time()
        super().__init__(config)
        self.clock = Clock(began)
        self.clock.ready()

    @otpmesh.endpoint(let_it_crash=False)
    async def generate(self, iteration: int, weights: RDMABuffer) -> Batch:
        started = time.perf_counter()
        await weights.read_into(self.flat)
        read = time.perf_counter()
        if (held := self.clock.take_armed()) is not None:
            Path(held).touch()
            await trio.sleep_forever()  # until SIGKILLed: mid-generate
        batch = task.generate(self.policy, self.cfg, iteration, otpmesh.context().rank)
        self.clock.record(
            iteration, weight_sync=read - started, generate=time.perf_counter() - read
        )
        self.clock.born.setdefault("first_reply", time.time())
        return batch


class TimedReward(Clocked, RewardModel):
    """The reward actor timing its scoring (by call: ``score`` is not told the iteration)."""

    def __init__(self, config: dict[str, Any]) -> None:
        began = time.time()
        super().__init__(config)
        self.clock = Clock(began)
        self.clock.ready()
        self.scored = 0

    @otpmesh.endpoint
    def score(self, batches: list[Batch]) -> list[torch.Tensor]:
        started = time.perf_counter()
        rewards = super().score(batches)
        self.clock.record(self.scored, score=time.perf_counter() - started)
        self.scored += 1
        return rewards


class TimedLearner(Clocked, Learner):
    """The learner timing its update apart from its checkpoint; armed, it blocks between."""

    def __init__(self, config: dict[str, Any]) -> None:
        began = time.time()
        super().__init__(config)
        self.clock = Clock(began)
        self.saving = 0.0

    async def on_start(self) -> None:
        await super().on_start()
        self.clock.ready()

    @otpmesh.endpoint
    def update(
        self, iteration: int, batches: list[Batch], rewards: list[torch.Tensor]
    ) -> dict[str, float]:
        self.clock.record(iteration, began=time.time())  # the end of the iteration's calls before
        started, self.saving = time.perf_counter(), 0.0
        stats = super().update(iteration, batches, rewards)
        total = time.perf_counter() - started
        self.clock.record(iteration, update=total - self.saving, checkpoint=self.saving)
        return stats

    @otpmesh.endpoint
    def stats(self, iteration: int) -> dict[str, float] | None:
        # The controller's first call to a new incarnation (run_iteration asks it first).
        self.clock.born.setdefault("first_reply", time.time())
        return super().stats(iteration)

    def save(self) -> None:
        if (held := self.clock.take_armed()) is not None:
            Path(held).touch()
            while True:  # until SIGKILLed: mid-update, its compute done, not checkpointed
                time.sleep(1.0)
        started = time.perf_counter()
        super().save()
        self.saving = time.perf_counter() - started
