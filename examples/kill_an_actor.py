"""Kill an actor: a one-for-one supervised mesh of 4 actors; one raises, one is SIGKILLed.

The supervision events show each failure and restart; the other actors keep answering
throughout, and the failed ones come back (the crashed one inside its live process, the killed
one in a fresh process on the same slot).

    python examples/kill_an_actor.py
"""

from __future__ import annotations

import os
import signal

import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, LogKind, Mesh, Supervisor


class Rollout(otpmesh.Actor):
    def __init__(self) -> None:
        self.steps = 0

    @otpmesh.endpoint
    def step(self) -> dict[str, int]:
        self.steps += 1
        return {"rank": otpmesh.context().rank, "pid": os.getpid(), "steps": self.steps}

    @otpmesh.endpoint
    def fail(self) -> None:
        raise RuntimeError("simulated rollout bug")


tree = Supervisor(
    "rl",
    children=[Mesh("rollouts", Rollout, shape={"procs": 4}, strategy=ONE_FOR_ONE, intensity=5)],
)


def show(values: otpmesh.ValueMesh[dict[str, int]]) -> str:
    return "  ".join(f"r{v['rank']}:pid{v['pid']}/steps{v['steps']}" for v in values)


async def wait_for_exit(app: otpmesh.App, path: str) -> None:
    while not any(e.kind == LogKind.CHILD_EXITED and e.child_path == path for e in app.events):
        await trio.sleep(0.01)


async def main() -> None:
    async with otpmesh.start(tree) as app:
        rollouts = app.mesh("rl/rollouts")
        print("before:      ", show(await rollouts.step()))

        try:
            await rollouts[1].fail()  # let it crash
        except otpmesh.ActorError as error:
            print(f"rank 1 raised: {error.type_name}: {error.message}")
        print("others:      ", show(await rollouts.slice(procs=slice(2, 4)).step()))

        victim = (await rollouts[3].step())["pid"]
        os.kill(victim, signal.SIGKILL)  # the process is gone, not just the actor
        print(f"SIGKILLed rank 3 (pid {victim})")
        await wait_for_exit(app, "rl/rollouts/3")
        print("after:       ", show(await rollouts.step()))

        await app.settled()
        print("\nsupervision events:")
        for e in app.events:
            reason = "" if e.reason is None else f"  ({otpmesh.describe(e.reason)})"
            incarnation = "" if e.incarnation is None else f" #{e.incarnation}"
            print(f"  {e.kind:<20} {e.child_path}{incarnation}{reason}")


if __name__ == "__main__":
    otpmesh.run(main)
