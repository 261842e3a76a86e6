"""A Monarch program, run two ways: as written for Monarch (only its import changed, to
``otpmesh.monarch``), and the same program in otpmesh's own API. Both print the same lines.

    python examples/from_monarch.py            # the Monarch program, through otpmesh.monarch
    python examples/from_monarch.py --native   # the same, in otpmesh's API

The Monarch version is sync (``.get()`` on every result, no event loop); the native one is a
trio program. The trainers' counter shows an endpoint's exception going back to its caller
while the actor keeps its state, Monarch's rule, which both versions follow here.
"""

from __future__ import annotations

import operator
import sys

import otpmesh
from otpmesh.monarch import Accumulator, Actor, ActorError, current_rank, endpoint, this_host


class Trainer(Actor):  # Monarch's spelling: the same class serves both versions
    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.steps = 0

    @endpoint
    def step(self) -> int:
        self.steps += 1
        return self.steps

    @endpoint
    def set_lr(self, lr: float) -> None:
        if lr <= 0:
            raise ValueError(f"learning rate must be positive, not {lr}")
        self.lr = lr

    @endpoint
    def report(self) -> str:
        return f"rank {current_rank().rank}: {self.steps} steps at lr {self.lr}"


def monarch_main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    trainers = procs.spawn("trainers", Trainer, 0.1)
    trainers.step.broadcast()  # fire and forget; FIFO with what follows
    print("steps:", trainers.step.call().get().values())
    total = Accumulator(trainers.step, 0, operator.add).accumulate().get()
    print("sum of steps:", total)
    try:
        trainers.slice(gpus=1).set_lr.call_one(-1.0).get()
    except ActorError as error:
        print("refused:", error.message)
    for _point, line in trainers.report.call().get():
        print(line)
    procs.stop().get()


async def native_main() -> None:
    procs = await otpmesh.proc_mesh(gpus=4)
    trainers = await procs.spawn("trainers", Trainer, 0.1)
    await trainers.step.broadcast()
    print("steps:", (await trainers.step.call()).values())
    print("sum of steps:", sum((await trainers.step.call()).values()))
    try:
        await trainers[1].set_lr(-1.0)
    except otpmesh.ActorError as error:
        print("refused:", error.message)
    for line in await trainers.report.call():
        print(line)
    await procs.stop()


if __name__ == "__main__":
    if "--native" in sys.argv[1:]:
        otpmesh.run(native_main)
    else:
        monarch_main()
