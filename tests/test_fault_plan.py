"""chaos.FaultPlan: faults pinned to steps of the caller's loop, so the same plan throws the same
faults at the same points whatever the clock does."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import otpmesh
from otpmesh import ONE_FOR_ONE, LogKind, Mesh, Supervisor, Worker, chaos
from otpmesh.chaos import FaultPlan, PlannedFault
from tests.actors import Member

TREE = Supervisor(
    "s",
    intensity=20,
    period=10.0,
    children=[
        Worker("w", Member),
        Mesh("m", Member, shape={"procs": 3}, strategy=ONE_FOR_ONE, intensity=20, period=10.0),
    ],
)


def _in_app(check, placement: str = "local"):  # type: ignore[no-untyped-def]
    async def body():  # type: ignore[no-untyped-def]
        async with otpmesh.start(TREE, placement=placement) as app:
            return await check(app)

    return trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_seeded_plan_is_the_same_for_the_same_seed_and_other_for_another() -> None:
    async def plans(app: otpmesh.App) -> list[FaultPlan]:
        return [
            FaultPlan.seeded(app, seed=seed, steps=50, count=8, targets=["s/m/*"])
            for seed in (1, 1, 2)
        ]

    first, again, other = _in_app(plans)
    assert first == again and first != other
    steps = [fault.step for fault in first.faults]
    assert steps == sorted(set(steps)) and len(steps) == 8  # distinct steps, in order
    assert all(1 <= step < 50 for step in steps)
    assert {fault.path for fault in first.faults} <= {"s/m/0", "s/m/1", "s/m/2"}
    assert {fault.kind for fault in first.faults} <= {"crash", "kill"}
    assert str(first).startswith(f"step {steps[0]}: ")


def test_a_plan_draws_kinds_by_their_weights() -> None:
    async def plan(app: otpmesh.App) -> FaultPlan:
        return FaultPlan.seeded(app, seed=0, steps=40, count=30, faults={"stop": 1, "crash": 0})

    assert {fault.kind for fault in _in_app(plan).faults} == {"stop"}


def test_bad_plans_are_refused_with_the_value_seen() -> None:
    async def refusals(app: otpmesh.App) -> None:
        with pytest.raises(ValueError, match=r"count=10 faults do not fit .* range\(1, 5\)"):
            FaultPlan.seeded(app, seed=0, steps=5, count=10)
        with pytest.raises(ValueError, match=r"no actor of this tree matches targets \['x/\*'\]"):
            FaultPlan.seeded(app, seed=0, steps=5, count=1, targets=["x/*"])
        with pytest.raises(ValueError, match=r"unknown faults \['meteor'\]"):
            FaultPlan.seeded(app, seed=0, steps=5, count=1, faults={"meteor": 1})
        with pytest.raises(ValueError, match="needs a positive weight"):
            FaultPlan.seeded(app, seed=0, steps=5, count=1, faults={"crash": 0})

    _in_app(refusals)
    with pytest.raises(ValueError, match=r"steps must be >= 0 and in order, not \[3, 1\]"):
        FaultPlan([PlannedFault(3, "crash", "s/w"), PlannedFault(1, "crash", "s/w")])
    with pytest.raises(ValueError, match=r"unknown faults \['meteor'\]"):
        FaultPlan([PlannedFault(3, "meteor", "s/w")])


def test_each_fault_is_thrown_at_its_step_only_and_restarts_the_actor_it_hit() -> None:
    plan = FaultPlan(
        [
            PlannedFault(2, "crash", "s/m/1"),
            PlannedFault(2, "kill", "s/m/2"),  # two at one step: the second waits for nothing
            PlannedFault(5, "crash", "s/w"),
        ]
    )

    async def run(app: otpmesh.App) -> list[tuple[int, list[str]]]:
        thrown = []
        for step in range(8):
            faults = await plan.inject(app, step)
            thrown.append((step, [f"{fault.kind} {fault.path}" for fault in faults]))
            assert all(fault.hit for fault in faults)
            await app.mesh("s/m").ping()  # the loop's own work goes on
        await app.settled()
        exited = [e.child_path for e in app.events.of_kind(LogKind.CHILD_EXITED)]
        # One exit per fault; the two of step 2 race each other, step 5's comes after both.
        assert sorted(exited[:2]) == ["s/m/1", "s/m/2"] and exited[2:] == ["s/w"]
        injected = [str(e.reason) for e in app.events.of_kind(LogKind.FAULT_INJECTED)]
        assert injected == [
            "crash s/m/1 (planned, step 2)",
            "kill s/m/2 (in-process)",
            "crash s/w (planned, step 5)",
        ]
        return [entry for entry in thrown if entry[1]]

    assert _in_app(run) == [(2, ["crash s/m/1", "kill s/m/2"]), (5, ["crash s/w"])]


def test_a_planned_sigkill_meets_a_fresh_process_after_an_earlier_one() -> None:
    """Over real processes: the second kill at the next step waits for the first's restart
    (inject settles first), so it hits the new process rather than missing a dead one."""
    plan = FaultPlan([PlannedFault(1, "kill", "s/m/0"), PlannedFault(2, "kill", "s/m/0")])

    async def run(app: otpmesh.App) -> list[bool]:
        hits = []
        for step in range(4):
            for fault in await plan.inject(app, step):
                assert fault.detail.startswith("SIGKILL pid "), fault  # a real process
                hits.append(fault.hit)
        await otpmesh.retry(app.mesh("s/m")[0].ping)
        await app.settled()
        exited = [e.child_path for e in app.events.of_kind(LogKind.CHILD_EXITED)]
        assert exited == ["s/m/0", "s/m/0"]
        return hits

    async def body() -> list[bool]:
        with trio.fail_after(60):
            async with otpmesh.start(TREE) as app:
                return await run(app)

    assert trio.run(body) == [True, True]


def test_stopping_a_supervisor_stops_its_children_in_order_and_its_parent_restarts_it() -> None:
    """chaos.stop at a supervisor's path (a stop forced on it): it terminates its children in
    reverse start order and exits with the reason; its parent (one_for_one) restarts it, static
    children in order."""
    tree = Supervisor(
        "s",
        intensity=5,
        children=[
            Worker("w", Member),
            Supervisor("sub", children=[Worker("a", Member), Worker("b", Member)]),
        ],
    )

    async def body() -> list[str]:
        async with otpmesh.start(tree, placement="local") as app:
            await trio.sleep(1.0)  # MockClock: what follows is told apart by its time
            fault = await chaos.stop(app, "s/sub", "boom")
            assert fault.hit and str(fault) == "stop s/sub ('boom')"
            await app.settled()
            assert await app.actor("s/sub/a").ping() == "s/sub/a"
            return [str(e) for e in app.events if e.time > 0]

    seen = trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [" ".join(line.split()) for line in seen] == [
        "fault_injected s/sub (stop s/sub ('boom'))",
        "child_terminated s/sub/b #1 (stopped (shutdown))",
        "child_terminated s/sub/a #1 (stopped (shutdown))",
        "supervisor_exited s/sub (exited with 'boom')",
        "child_exited s/sub #1 (exited with 'boom')",
        "child_started s/sub/a #2",
        "child_started s/sub/b #2",
        "supervisor_started s/sub",
        "child_started s/sub #2",
    ]
