"""When the controller dies: a standby controller takes the running tree over, and the driver
resumes from the step counter its actors keep.

Start the same program twice with one state directory; the second waits as the standby:

    STATE=$(mktemp -d)  # a directory only this user can have made
    python examples/takeover.py --dir "$STATE" &
    python examples/takeover.py --dir "$STATE" --standby &
    kill -9 %1        # the active controller dies mid-run

The standby takes the lease, adopts the four shard processes (their state intact, nothing
restarted) and runs `main` again, which reads the step the shards reached and goes on from there.
Each shard adds (step + 1) * (rank + 1) once per step, so the totals at the end show that no
step was lost or applied twice.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import trio

import otpmesh
from otpmesh import Mesh, Supervisor


class Shard(otpmesh.Actor):
    def __init__(self) -> None:
        self.step = 0
        self.total = 0

    @otpmesh.endpoint
    async def apply(self, step: int) -> int:
        # Idempotent: a driver that resumes after a takeover may send the step whose reply its
        # dead predecessor never saw; a shard that applied it already leaves it be.
        if step == self.step:
            self.total += (step + 1) * (otpmesh.context().rank + 1)
            self.step += 1
        return self.step

    @otpmesh.endpoint
    async def state(self) -> dict[str, Any]:
        return {"step": self.step, "total": self.total, "pid": os.getpid()}


TREE = Supervisor("job", children=[Mesh("shards", Shard, shape={"procs": 4})])


async def main(state_dir: str, steps: int, standby: bool, pause: float, grace: float) -> None:
    takeover = otpmesh.Takeover(dir=state_dir, grace=grace, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        shards = app.mesh("job/shards")
        # Where the run got to lives in the actors, not in this process: resume from there.
        step = min(s["step"] for s in (await shards.state()).values())
        children = app.which_children("job/shards")  # newest first, as OTP's
        incarnations = [c.incarnation for c in sorted(children, key=lambda c: int(c.id))]
        if app.resumed is not None:  # it took a running tree over: say from whom, and how
            print(f"resumed: {app.resumed}")
        print(f"driver (pid {os.getpid()}) starts at step {step}, incarnations {incarnations}")
        while step < steps:
            await shards.apply(step)
            step += 1
            print(f"step {step}", flush=True)
            await trio.sleep(pause)
        for rank, state in enumerate((await shards.state()).values()):
            print(f"shard {rank}: step {state['step']} total {state['total']} pid {state['pid']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="the state directory (made 0700)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--standby", action="store_true", help="wait for the active one's lease")
    parser.add_argument("--pause", type=float, default=0.1, help="seconds between steps")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds workers wait")
    args = parser.parse_args()
    otpmesh.run(main, args.dir, args.steps, args.standby, args.pause, args.grace)
