"""Controller kills in a chaos.FaultPlan: real controllers SIGKILLed by their own plan, standbys
taking over and going on with the plan where it stopped; and the rule without a takeover (a
TakeoverError before anything is killed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio
import trio.testing

import otpmesh
from otpmesh import Supervisor, TakeoverError, Worker, chaos
from otpmesh.chaos import FaultPlan, PlannedFault
from tests.actors import Member
from tests.test_takeover import Program, start_job

PLAN_JOB = """
import otpmesh
from otpmesh import Supervisor, Worker
from otpmesh.chaos import FaultPlan, PlannedFault


class Counter(otpmesh.Actor):
    def __init__(self) -> None:
        self.step = 0

    @otpmesh.endpoint
    async def apply(self, step: int) -> int:
        if step == self.step:  # idempotent: a resumed driver may send a step again
            self.step += 1
        return self.step


TREE = Supervisor(
    "job", intensity=10, period=600.0,
    children=[Worker("counter", Counter), Worker("other", Counter)],
)
# Two controller kills; at step 2 a crash before the kill and one after it.
PLAN = FaultPlan([
    PlannedFault(1, "crash", "job/other"),
    PlannedFault(2, "crash", "job/other"),
    PlannedFault(2, "controller", "controller"),
    PlannedFault(2, "crash", "job/other"),
    PlannedFault(3, "controller", "controller"),
])


async def main(state: str, standby: bool) -> None:
    takeover = otpmesh.Takeover(dir=state, grace=60.0, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        seeded = [
            FaultPlan.seeded(app, seed=7, steps=20, count=3, targets=["job/*"], controller_kills=k)
            for k in (0, 2)
        ]
        print("seeded:", seeded[0], "|", seeded[1], flush=True)
        counter = app.actor("job/counter")
        step = await counter.apply(-1)  # where the run got to: the counter's
        print(f"driver starts at step {step}", flush=True)
        while step < 5:
            thrown = await PLAN.inject(app, step)
            print(f"step {step}: {'; '.join(map(str, thrown)) or '-'}", flush=True)
            step = await counter.apply(step)
        await app.settled()
        print("done", flush=True)
"""


@pytest.mark.timeout(240)
def test_a_plan_kills_its_controllers_and_each_standby_goes_on_where_it_stopped(
    tmp_path: Path,
) -> None:
    job, state, active = start_job(tmp_path, PLAN_JOB)
    active.wait_for("driver starts at step 0")
    standbys = [Program(state, "--standby", program=job) for _ in range(2)]
    active.finish(status=-9)
    outputs = [active.lines]
    for standby in standbys:  # the first to take the lease is killed at step 3: either one
        code = standby.proc.wait(120)
        assert code in (0, -9), "\n".join(standby.finish(status=code))
        outputs.append(standby.finish(status=code))
    first, second = sorted(outputs[1:], key=lambda lines: "done" in lines)
    pids = [p.proc.pid for p in (active, *standbys)]
    steps = [line for line in outputs[0] if line.startswith("step ")]
    assert steps == ["step 0: -", "step 1: crash job/other (planned, step 1)"], outputs[0]
    took_over = r"kill the controller \(SIGKILL pid (\d+), the controller this one took over from\)"
    # The first standby resumes at step 2: the crash before the kill is not thrown again, the
    # one after it is; then the plan kills it at step 3.
    assert "driver starts at step 2" in first
    steps = [line for line in first if line.startswith("step ")]
    step2 = re.fullmatch(rf"step 2: {took_over}; crash job/other \(planned, step 2\)", steps[0])
    assert step2 and int(step2[1]) == active.proc.pid and len(steps) == 1, first
    assert first[-1].startswith("chaos: kill the controller (SIGKILL pid "), first
    # The second resumes at step 3, finds that kill journalled, and finishes the run.
    assert "driver starts at step 3" in second
    step3 = [line for line in second if line.startswith("step ")]
    assert step3[1:] == ["step 4: -"], second
    killed = re.fullmatch(rf"step 3: {took_over}", step3[0])
    assert killed and int(killed[1]) in pids[1:], step3
    # A seeded plan's actor faults are the same with controller kills as without them.
    seeded = next(line for line in first if line.startswith("seeded: "))
    without, with_kills = seeded.removeprefix("seeded: ").split(" | ")
    assert len(re.findall(r"step \d+: kill the controller", with_kills)) == 2, with_kills
    actor_faults = [f for f in with_kills.split("; ") if "controller" not in f]
    assert actor_faults == without.split("; ")


TREE = Supervisor("s", children=[Worker("w", Member)])


def test_a_controller_kill_without_a_takeover_is_refused_before_anything_dies() -> None:
    async def body() -> None:
        async with otpmesh.start(TREE, placement="local") as app:
            with pytest.raises(TakeoverError, match=r"runs without a takeover.*Takeover\(dir="):
                FaultPlan.seeded(app, seed=0, steps=10, count=2, controller_kills=1)
            plan = FaultPlan([PlannedFault(3, "crash", "s/w"), PlannedFault(3, "controller", "c")])
            assert await plan.inject(app, 2) == []  # other steps are thrown as before
            with pytest.raises(TakeoverError, match="a plan's controller kill SIGKILLs"):
                await plan.inject(app, 3)
            with pytest.raises(TakeoverError, match=r"chaos\.kill_controller SIGKILLs"):
                await chaos.kill_controller(app)
            assert not app.events.of_kind("fault_injected")  # nothing was thrown
            with pytest.raises(ValueError, match="controller_kills=N"):
                FaultPlan.seeded(app, seed=0, steps=10, count=2, faults={"controller": 1})
            with pytest.raises(ValueError, match="controller_kills=N"):
                chaos.ChaosMonkey(app, faults={"controller": 1.0})

    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))
