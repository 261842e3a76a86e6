"""The reference model and SupervisionMachine over trees whose actors own subtrees.

Model unit tests are pure (microseconds); the real runs use placement="local" under MockClock
(every level in this process: the owner's subtree too), so their times are exact."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import run_state_machine_as_test

import otpmesh
from otpmesh import ONE_FOR_ONE, Actor, ActorCrash, LogKind, Mesh, Supervisor, Worker, chaos
from otpmesh._core._reasons import KILLED, SHUTDOWN
from otpmesh.testing import (
    Crash,
    KillSupervisor,
    StopSupervisor,
    SupervisionMachine,
    owned_trees,
    simulate,
)
from otpmesh.testing._logkeys import first_difference


class Leaf(Actor):
    @otpmesh.endpoint
    async def ping(self) -> str:
        return otpmesh.context().path


class Owner(Actor):
    """Starts the subtree it is given in on_start, as a service starts its replicas."""

    def __init__(self, spec: Supervisor | Mesh) -> None:
        self.spec = spec

    async def on_start(self) -> None:
        self.sub = await otpmesh.context().start(self.spec)

    @otpmesh.endpoint
    async def ping(self) -> str:
        return otpmesh.context().path


REPLICAS = Mesh("replicas", Leaf, shape={"procs": 2}, strategy=ONE_FOR_ONE, intensity=0)
TREE = Supervisor(
    "top",
    intensity=3,
    period=60.0,
    children=[Worker("a", Leaf), Worker("svc", Owner, args=(REPLICAS,))],
)
OWNED = {"top/svc": REPLICAS}


def _lines(log: list[Any]) -> list[tuple[str, str, object]]:
    return [(str(e.kind), e.child_path, e.incarnation) for e in log]


def _reason(log: list[Any], kind: LogKind, path: str) -> object:
    return next(e.reason for e in log if e.kind is kind and e.child_path == path)


# ---------------------------------------------------------------- the model


def test_an_owner_starts_its_subtree_before_it_counts_as_started() -> None:
    sim = simulate(TREE, owned=OWNED, stop=False)
    assert _lines(sim.log) == [
        ("child_started", "top/a", 1),
        ("child_started", "top/svc/replicas/0", 1),
        ("child_started", "top/svc/replicas/1", 1),
        ("supervisor_started", "top/svc/replicas", None),
        ("child_started", "top/svc", 1),
        ("supervisor_started", "top", None),
    ]
    assert {"top/svc/replicas", "top/svc/replicas/1"} <= sim.running()


def test_an_owner_crash_stops_its_subtree_and_the_restarted_owner_starts_a_fresh_one() -> None:
    sim = simulate(TREE, [Crash("top/svc")], owned=OWNED, stop=False)
    assert _lines(sim.log[6:]) == [
        ("child_terminated", "top/svc/replicas/1", 1),
        ("child_terminated", "top/svc/replicas/0", 1),
        ("supervisor_exited", "top/svc/replicas", None),
        ("child_exited", "top/svc", 1),
        ("child_started", "top/svc/replicas/0", 1),  # a new tree: incarnations from 1
        ("child_started", "top/svc/replicas/1", 1),
        ("supervisor_started", "top/svc/replicas", None),
        ("child_started", "top/svc", 2),
    ]
    assert _reason(sim.log, LogKind.SUPERVISOR_EXITED, "top/svc/replicas") == SHUTDOWN


def test_a_subtree_that_gives_up_crashes_its_owner_and_escalation_goes_on_up() -> None:
    sim = simulate(TREE, [Crash("top/svc/replicas/1", "boom")], owned=OWNED, stop=False)
    reason = _reason(sim.log, LogKind.CHILD_EXITED, "top/svc")
    assert reason == ActorCrash(
        "SupervisorError",
        "supervisor top/svc/replicas reached its restart intensity (0 restarts in 5.0 s); "
        "last exits: top/svc/replicas/1 exited with 'boom'",
    )
    assert ("child_started", "top/svc", 2) in _lines(sim.log)
    # Every level at intensity 0: the replica's crash ends the whole app.
    strict = Supervisor("top", intensity=0, children=list(TREE.children))
    sim = simulate(strict, [Crash("top/svc/replicas/0")], owned=OWNED, stop=False)
    assert not sim.alive and not sim.running()
    assert [e.child_path for e in sim.log if e.kind is LogKind.RESTART_INTENSITY_REACHED] == [
        "top/svc/replicas/0",
        "top/svc",
    ]


def test_killing_a_subtree_crashes_its_owner_and_killing_the_owners_supervisor_stops_it() -> None:
    sim = simulate(TREE, [KillSupervisor("top/svc/replicas")], owned=OWNED, stop=False)
    reason = _reason(sim.log, LogKind.CHILD_EXITED, "top/svc")
    assert isinstance(reason, ActorCrash) and reason.message == (
        "supervisor top/svc/replicas exited: killed"
    )
    nested = Supervisor("top", children=[Supervisor("mid", children=list(TREE.children))])
    owned = {"top/mid/svc": REPLICAS}
    sim = simulate(nested, [KillSupervisor("top/mid")], owned=owned, stop=False)
    assert ("exit", "top/mid/svc", KILLED) in sim.trace
    # The owner was killed; what it owned is stopped in order, as after any exit of its.
    assert ("exit", "top/mid/svc/replicas", SHUTDOWN) in sim.trace
    assert _lines(sim.log)[-1] == ("child_started", "top/mid", 2)


def test_an_owner_stopping_its_own_subtree_lives_on() -> None:
    sim = simulate(TREE, [StopSupervisor("top/svc/replicas")], owned=OWNED, stop=False)
    assert "top/svc" in sim.running() and "top/svc/replicas" not in sim.running()
    assert not [e for e in sim.log if e.kind is LogKind.CHILD_EXITED]


def test_owned_must_name_worker_paths_and_specs() -> None:
    with pytest.raises(ValueError, match=r"owned names \['top/nope'\], which are not worker"):
        simulate(TREE, owned={"top/nope": REPLICAS})
    with pytest.raises(TypeError, match=r"owned\['top/svc'\] must be the Supervisor or Mesh"):
        simulate(TREE, owned={"top/svc": Worker("x", Leaf)})  # type: ignore[dict-item]


# ---------------------------------------------------------------- the real tree, locally


def _run(body: Any) -> Any:
    return trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_local_owner_starts_its_subtree_in_process_and_the_log_matches_the_model() -> None:
    async def body() -> list[Any]:
        async with otpmesh.start(TREE, placement="local") as app:
            assert await app.actor("top/svc/replicas/1").ping() == "top/svc/replicas/1"
            ids = [c.id for c in app.which_children("top/svc/replicas")]
            assert sorted(ids) == ["0", "1"]
            await chaos.crash(app, "top/svc/replicas/1", "x")  # gives up: the owner restarts
            await app.settled()
            await chaos.crash(app, "top/svc", "y")  # the owner: its subtree goes with it
            await app.settled()
            assert await app.actor("top/svc/replicas/0").ping() == "top/svc/replicas/0"
        return [e for e in app.events if e.kind is not LogKind.FAULT_INJECTED]

    real = _run(body)
    crash = ActorCrash("ChaosCrash", "x")
    steps = [Crash("top/svc/replicas/1", crash), Crash("top/svc", ActorCrash("ChaosCrash", "y"))]
    model = simulate(TREE, steps, owned=OWNED)
    assert first_difference(real, model.log, OWNED, frozenset({"top/svc/replicas"}), True) is None


def test_a_restarted_owners_subtree_is_not_blamed_for_its_predecessors_give_up() -> None:
    # The log is shared by an owner's tree and every subtree it ever had: a give-up error must
    # read only the entries of the subtree that just exited (_core/_giveup.py).
    async def body() -> object:
        async with otpmesh.start(TREE, placement="local") as app:
            await chaos.crash(app, "top/svc/replicas/1", "x")  # subtree 1 reaches intensity
            await app.settled()
            await chaos.kill(app, "top/svc/replicas")  # subtree 2's root is killed
            await app.settled()
            exits = app.events.of_kind(LogKind.CHILD_EXITED)
            return [e.reason for e in exits if e.child_path == "top/svc"][-1]

    reason = _run(body)
    assert isinstance(reason, ActorCrash)
    assert reason.message == "supervisor top/svc/replicas exited: killed"


# ---------------------------------------------------------------- the machine


class OwnedService(SupervisionMachine):
    """A worker beside an owner of a mesh; faults at both levels and at the replicas."""

    tree = TREE
    owned = OWNED


TestOwnedService = OwnedService.TestCase
TestOwnedService.settings = settings(
    max_examples=8,
    stateful_step_count=6,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@settings(max_examples=4, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(owned_trees(Leaf, Owner, max_depth=1, max_children=3, periods=(5.0,)))
def test_drawn_trees_whose_workers_own_subtrees_follow_the_model(
    drawn: tuple[Supervisor, dict[str, Supervisor | Mesh]],
) -> None:
    tree, owned = drawn

    class Drawn(SupervisionMachine):
        pass

    Drawn.tree, Drawn.owned = tree, owned
    run_state_machine_as_test(
        Drawn, settings=settings(max_examples=3, stateful_step_count=5, deadline=None)
    )


def test_the_machine_checks_its_owned_mapping() -> None:
    class Wrong(SupervisionMachine):
        tree = TREE
        owned = {"top/ghost": REPLICAS}

    with pytest.raises(ValueError, match=r"owned names \['top/ghost'\]"):
        Wrong()
