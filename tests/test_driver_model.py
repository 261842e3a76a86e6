"""The trio driver against the reference model: the same generated trees and fault schedules run
through ``otpmesh.start`` (in-process actors, MockClock) and through ``otpmesh.testing.simulate``
(the pure model, checked against Erlang/OTP in test_supervisor_erlang.py), and the two event logs
must be identical — kinds, paths, incarnations, reasons and times."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otpmesh
from otpmesh import BRUTAL_KILL, ESCALATE, INFINITY, ONE_FOR_ALL, ONE_FOR_ONE, REST_FOR_ONE
from otpmesh.testing import (
    Advance,
    Call,
    Crash,
    Step,
    fault_schedules,
    simulate,
    supervision_trees,
)
from tests.actors import Member

TREES = supervision_trees(
    Member,
    strategies=(ONE_FOR_ONE, ONE_FOR_ALL, REST_FOR_ONE, ESCALATE),
    periods=(5.0,),
    shutdowns=(BRUTAL_KILL, 1.0, INFINITY),
    max_children=3,
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[otpmesh.Supervisor, list[Step]]:
    tree = draw(TREES)
    return tree, draw(fault_schedules(tree, Member, stops=False, advances=(0.5, 3.0, 6.0)))


def _key(entries: Any) -> list[tuple[Any, ...]]:
    entries = list(entries)
    t0 = entries[0].time if entries else 0.0
    return [
        (round(e.time - t0, 6), str(e.kind), e.path, e.child, e.incarnation, e.reason)
        for e in entries
    ]


async def _drive(tree: otpmesh.Supervisor, steps: list[Step]) -> list[Any]:
    events: list[Any] = []
    try:
        async with otpmesh.start(tree, placement="local") as app:
            events = app.events._entries
            for step in steps:
                await _apply(app, step)
                await app.settled()
    except otpmesh.SupervisorError:
        pass  # the root gave up; the model records the same exits
    return events


async def _apply(app: otpmesh.App, step: Step) -> None:
    if isinstance(step, Advance):
        await trio.sleep(step.seconds)
    elif isinstance(step, Crash):
        try:
            ref = app.actor(step.path)
        except KeyError:
            return  # a dynamic child that was never added
        try:
            await ref.with_timeout(1.0).quit(step.reason)
        except otpmesh.ActorDiedError:
            pass  # not running: the model skips it too
    elif isinstance(step, Call):
        try:
            if step.op == "start_child":
                assert step.spec is not None
                await app.start_child(step.sup, step.spec)
            else:
                await getattr(app, step.op)(f"{step.sup}/{step.id}")
        except (otpmesh.ChildError, KeyError):
            pass  # an OTP error outcome (or the supervisor is not running): the model agrees


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cases())
def test_driver_logs_what_the_reference_model_logs(
    case: tuple[otpmesh.Supervisor, list[Step]],
) -> None:
    tree, steps = case
    model = simulate(tree, steps)
    driven = trio.run(_drive, tree, steps, clock=trio.testing.MockClock(autojump_threshold=0))
    assert _key(driven) == _key(model.log)


def test_a_known_schedule_matches() -> None:
    tree = otpmesh.Supervisor(
        "root",
        strategy=REST_FOR_ONE,
        intensity=2,
        children=[otpmesh.Worker("w0", Member), otpmesh.Worker("w1", Member)],
    )
    steps: list[Step] = [Crash("root/w0", "boom"), Advance(6.0), Crash("root/w1", "normal")]
    driven = trio.run(_drive, tree, steps, clock=trio.testing.MockClock(autojump_threshold=0))
    assert _key(driven) == _key(simulate(tree, steps).log)
    assert len(driven) > 8


pytestmark = pytest.mark.filterwarnings("ignore")
