"""A takeover resumes the live tree: in the reference model (every supervisor a core, driven
as the trio driver drives them), a run whose controller dies at a drawn step and is resumed
from the journal alone traces, and leaves every child list, exactly as the same run without
the takeover, where the workers that died in the gap simply exited. OTP has no controller:
the run without takeovers is OTP's (tests/test_supervisor_erlang.py checks the model against
the real OTP 25 supervisor, across takeovers too)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otpmesh._core import _actor
from otpmesh._core._livetree import LiveTree
from otpmesh._core._spec import (
    ALL_SIGNIFICANT,
    TEMPORARY,
    TRANSIENT,
    Supervisor,
    Worker,
)
from otpmesh.testing import (
    Call,
    Crash,
    Simulation,
    StartOutcome,
    Step,
    fault_schedules,
    supervision_trees,
    tree_paths,
)
from otpmesh.testing._steps import ModelStep, Takeover


class Actor(_actor.Actor):
    """Stands for an actor class: the model never instantiates it."""


def _as_otp_sees_it(step: ModelStep) -> list[Step]:
    """What OTP sees of `step`: a takeover's lost workers exit, nothing else."""
    if isinstance(step, Takeover):
        return [Crash(path, step.reason) for path in step.lost]
    return [step]


def _run(
    tree: Supervisor,
    steps: list[ModelStep],
    plans: dict[str, list[StartOutcome]],
    takeovers: bool,
) -> tuple[list[object], list[object]]:
    """The trace, and every supervisor's which_children after each step; without
    `takeovers`, each is replaced by what OTP sees of it."""
    sim = Simulation(tree, start_plans=plans).start()
    lists: list[object] = []
    for step in steps:
        for part in [step] if takeovers else _as_otp_sees_it(step):
            if sim.alive:
                sim.apply(part)
        lists.append([(p, sim.core(p).which_children()) for p in sim.supervisors()])
    sim.run([])  # stop the root: the order of the last exits shows the final child lists
    return sim.trace, lists


def assert_same_across_takeovers(
    tree: Supervisor, steps: list[ModelStep], plans: dict[str, list[StartOutcome]] | None = None
) -> None:
    plans = plans or {}
    with_takeovers = _run(tree, steps, plans, takeovers=True)
    without = _run(tree, steps, plans, takeovers=False)
    assert with_takeovers[0] == without[0], "traces differ"
    assert with_takeovers[1] == without[1], "child lists differ"


OUTCOMES: list[StartOutcome] = ["ok", "ok", "ok", "ignore", ("error", "nope")]


@st.composite
def cases(draw: st.DrawFn) -> tuple[Supervisor, dict[str, list[StartOutcome]], list[ModelStep]]:
    tree = draw(supervision_trees(Actor))
    workers, sups = tree_paths(tree)
    planned = draw(st.lists(st.sampled_from(workers + [f"{p}/dyn" for p, _ in sups]), max_size=3))
    plans = {p: draw(st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=3)) for p in planned}
    steps: list[ModelStep] = list(draw(fault_schedules(tree, Actor)))
    for _ in range(draw(st.integers(1, 3))):
        lost = draw(st.lists(st.sampled_from(workers + [f"{p}/dyn" for p, _ in sups]), max_size=1))
        at = draw(st.integers(0, len(steps)))
        steps.insert(at, Takeover(tuple(lost), draw(st.sampled_from(["killed", "normal"]))))
    return tree, plans, steps


@settings(
    max_examples=int(os.environ.get("OTPMESH_TAKEOVER_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cases())
def test_a_takeover_at_any_step_changes_nothing_but_what_died_in_the_gap(
    case: tuple[Supervisor, dict[str, list[StartOutcome]], list[ModelStep]],
) -> None:
    tree, plans, steps = case
    assert_same_across_takeovers(tree, steps, plans)


# ---- the cases issue 38 names, each by name ----------------------------------------------------


def _tree() -> Supervisor:
    return Supervisor(
        "root",
        intensity=3,
        period=3600.0,
        auto_shutdown=ALL_SIGNIFICANT,
        children=[
            Worker("w0", Actor),
            Worker("w1", Actor, restart=TRANSIENT, significant=True),
            Worker("tmp", Actor, restart=TEMPORARY),
            Supervisor("sub", restart=TEMPORARY, children=[Worker("a", Actor)]),
            Worker("w2", Actor, restart=TRANSIENT, significant=True),
        ],
    )


def test_a_child_added_by_start_child_is_still_there_after_a_takeover() -> None:
    dyn = Worker("dyn", Actor, shutdown=1.0)
    steps: list[ModelStep] = [
        Call("root", "start_child", spec=dyn),
        Takeover(),
        Call("root", "restart_child", id="dyn"),  # OTP: {error, running}
        Crash("root/dyn"),
    ]
    assert_same_across_takeovers(_tree(), steps)
    sim = Simulation(_tree()).start().run(steps, stop=False)
    assert ("reply", "root", "restart_child", "running") in sim.trace
    assert ("start", "root/dyn", "ok") in sim.trace[-2:]  # restarted after its crash


def test_a_terminated_child_stays_stopped_and_a_deleted_one_stays_deleted() -> None:
    steps: list[ModelStep] = [
        Call("root", "terminate_child", id="w0"),
        Call("root", "terminate_child", id="w2"),
        Call("root", "delete_child", id="w2"),
        Takeover(),
        Call("root", "restart_child", id="w2"),  # OTP: not_found
    ]
    assert_same_across_takeovers(_tree(), steps)
    sim = Simulation(_tree()).start().run(steps, stop=False)
    children = {c.id: c.status.value for c in sim.core("root").which_children()}
    assert children == {"w0": "undefined", "w1": "running", "tmp": "running", "sub": "running"}
    assert sim.trace[-1] == ("reply", "root", "restart_child", "not_found")


def test_temporary_children_that_died_stay_gone() -> None:
    steps: list[ModelStep] = [Crash("root/tmp"), Crash("root/sub/a"), Takeover()]
    steps.insert(2, Call("root", "terminate_child", id="sub"))
    assert_same_across_takeovers(_tree(), steps)
    sim = Simulation(_tree()).start().run(steps, stop=False)
    assert [c.id for c in sim.core("root").which_children()] == ["w2", "w1", "w0"]


def test_a_transient_childs_normal_exit_counts_towards_auto_shutdown_across_a_takeover() -> None:
    steps: list[ModelStep] = [Crash("root/w1", "normal"), Takeover(("root/w2",), "normal")]
    assert_same_across_takeovers(_tree(), steps)
    sim = Simulation(_tree()).start().run(steps, stop=False)
    assert not sim.alive and sim.root_exit == "shutdown"  # every significant child is done


def test_an_ignored_start_stays_not_running() -> None:
    steps: list[ModelStep] = [Crash("root/w0"), Takeover(), Crash("root/w1")]
    plans: dict[str, list[StartOutcome]] = {"root/w0": ["ok", "ignore"]}
    assert_same_across_takeovers(_tree(), steps, plans)
    sim = Simulation(_tree(), start_plans=plans).start().run(steps, stop=False)
    assert {c.id: c.status.value for c in sim.core("root").which_children()}["w0"] == "undefined"


def test_a_failing_start_after_a_takeover_is_its_supervisors_business() -> None:
    """A transient child exited normally, and its next start is set to fail: the standby does
    not start it (OTP would not); restarted by hand, its failure is a reply, not the end."""
    steps: list[ModelStep] = [
        Crash("root/w1", "normal"),
        Takeover(("root/w0",)),
        Call("root", "restart_child", id="w1"),
    ]
    plans: dict[str, list[StartOutcome]] = {"root/w1": ["ok", ("error", "bad")]}
    assert_same_across_takeovers(_tree(), steps, plans)
    sim = Simulation(_tree(), start_plans=plans).start().run(steps, stop=False)
    assert sim.alive
    assert sim.trace[-1] == ("reply", "root", "restart_child", ("start_error", "bad"))


def test_the_journal_compacts_to_what_folds_the_same() -> None:
    """``LiveTree.records()``: one whole list per supervisor still in the tree; folding them
    gives the same lists (a deleted temporary supervisor's is left out)."""
    dyn = Supervisor("dyn", restart=TEMPORARY, children=[Worker("x", Actor)])
    steps: list[ModelStep] = [
        Call("root", "start_child", spec=dyn),
        Crash("root/w0"),
        Crash("root/sub/a"),
        Call("root", "terminate_child", id="dyn"),
    ]
    sim = Simulation(_tree()).start().run(steps, stop=False)
    live = LiveTree()
    for record in sim.journal:
        live.add(record)
    again = LiveTree()
    for record in live.records():
        again.add(record)
    assert sorted(again.sups) == ["root", "root/sub"]
    for path in again.sups:
        assert again.rows(path, again.sups[path].incarnation) == live.rows(
            path, live.sups[path].incarnation
        )
