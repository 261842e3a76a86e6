"""The project's own use of ``otpmesh.testing.SupervisionMachine``: hypothesis throws crashes,
clean exits and kills (and calls) at running trees, and after every step the event log must be
the reference model's, every worker the model says runs must answer, every other one must be
reported dead at once, and no call may hang; after each example no worker process may remain.

In-process trees run hundreds of examples under MockClock; one tree runs over real worker
processes with real SIGKILLs, fewer examples."""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule, run_state_machine_as_test

from otpmesh import (
    ALL_SIGNIFICANT,
    BRUTAL_KILL,
    ESCALATE,
    INFINITY,
    ONE_FOR_ALL,
    ONE_FOR_ONE,
    REST_FOR_ONE,
    TEMPORARY,
    TRANSIENT,
    App,
    LogKind,
    Mesh,
    Supervisor,
    Worker,
)
from otpmesh.testing import SupervisionMachine
from tests.actors import Echo, Member

FAST = settings(
    deadline=None,
    stateful_step_count=15,
    suppress_health_check=[HealthCheck.too_slow],
)


class RolloutService(SupervisionMachine):
    """An RL-like tree: a learner, then a group that must restart together, then a mesh of
    rollouts; generous intensity, so faults mostly cause restarts."""

    tree = Supervisor(
        "rl",
        strategy=REST_FOR_ONE,
        intensity=5,
        period=10.0,
        children=[
            Worker("learner", Member, shutdown=INFINITY),
            Supervisor(
                "scoring",
                strategy=ONE_FOR_ALL,
                intensity=3,
                period=5.0,
                children=[
                    Worker("reward", Member, shutdown=BRUTAL_KILL),
                    Worker("judge", Member, restart=TRANSIENT),
                    Worker("cache", Member, restart=TEMPORARY),
                ],
            ),
            Mesh("rollouts", Member, shape={"procs": 3}, strategy=ONE_FOR_ONE, intensity=4),
        ],
    )


class FragileGroup(SupervisionMachine):
    """A tree that gives up quickly: an escalating mesh, a significant child, intensity 1, so
    examples cover escalation, auto-shutdown and the root giving up."""

    tree = Supervisor(
        "job",
        strategy=ONE_FOR_ONE,
        intensity=1,
        period=2.0,
        auto_shutdown=ALL_SIGNIFICANT,
        children=[
            Mesh("trainers", Member, shape={"gpus": 2}, strategy=ESCALATE),
            Worker("driver", Member, restart=TRANSIENT, significant=True),
            Worker("logger", Member, restart=TEMPORARY, shutdown=BRUTAL_KILL),
        ],
    )


class KilledProcesses(SupervisionMachine):
    """Real worker processes, real SIGKILLs: a restart must bring a fresh process."""

    tree = Supervisor(
        "svc",
        strategy=REST_FOR_ONE,
        intensity=20,
        period=60.0,
        children=[
            Mesh("replicas", Member, shape={"procs": 2}, intensity=20, period=60.0),
            Worker("router", Member, restart=TRANSIENT),
        ],
    )
    placement = "procs"
    faults = ("kill", "crash", "stop_normal")


TestRolloutService = RolloutService.TestCase
TestRolloutService.settings = settings(FAST, max_examples=130)
TestFragileGroup = FragileGroup.TestCase
TestFragileGroup.settings = settings(FAST, max_examples=100)
TestKilledProcesses = KilledProcesses.TestCase
TestKilledProcesses.settings = settings(FAST, max_examples=6, stateful_step_count=6)
TestKilledProcesses = pytest.mark.timeout(120)(TestKilledProcesses)


# ---- hangs: a wedged endpoint ended by its progress deadline, a SIGSTOPped process -------------


class StuckProcesses(SupervisionMachine):
    """Real processes whose next endpoint may wedge (its progress deadline ends the actor with
    ``Hung`` and its process is replaced) or be SIGSTOPped (the heartbeat watchdog kills it):
    the model predicts each exit and restart."""

    tree = Supervisor(
        "svc",
        intensity=20,
        period=60.0,
        children=[
            Worker("a", Member, progress_deadline=0.5),
            Mesh("pool", Member, shape={"procs": 2}, progress_deadline=0.5, intensity=20),
        ],
    )
    placement = "procs"
    faults = ("wedge", "hang", "crash")
    heartbeat_timeout = 0.5


TestStuckProcesses = StuckProcesses.TestCase
TestStuckProcesses.settings = settings(FAST, max_examples=2, stateful_step_count=4)
TestStuckProcesses = pytest.mark.timeout(120)(TestStuckProcesses)


@pytest.mark.timeout(60)
@settings(max_examples=1, deadline=None, database=None)
@given(st.none())
def test_a_wedge_and_a_hang_end_as_the_model_predicts(_: None) -> None:
    machine = StuckProcesses()
    try:
        machine.inject("svc/a", "wedge")
        machine.event_log_matches_model()
        machine.running_workers_answer()
        machine.call_during_fault("svc/pool/1", "hang", "svc/pool/0")
        machine.event_log_matches_model()
        machine.running_workers_answer()
        exits = machine.app.events.of_kind(LogKind.CHILD_EXITED)
        assert [(e.child_path, type(e.reason).__name__) for e in exits] == [
            ("svc/a", "Hung"),
            ("svc/pool/1", "ProcessExit"),
        ]
        assert exits[0].reason.endpoint == "ping"
        assert "chaos_wedge" in exits[0].reason.stacks
    finally:
        machine.teardown()


def test_wedge_and_hang_in_process_are_refused_with_the_reason() -> None:
    class InProcess(SupervisionMachine):
        tree = Supervisor("s", children=[Worker("w", Member, progress_deadline=1.0)])
        faults = ("crash", "wedge")

    with pytest.raises(ValueError, match=r"InProcess.faults has \['wedge'\].*placement = 'procs'"):
        InProcess()


def test_a_call_timeout_shorter_than_a_hang_is_refused() -> None:
    class Impatient(StuckProcesses):
        call_timeout = 0.6

    with pytest.raises(ValueError, match=r"call_timeout=0.6 s is too short for 'wedge'.*1 s"):
        Impatient()


def test_wedge_without_a_progress_deadline_names_the_workers_that_lack_one() -> None:
    class NoDeadline(SupervisionMachine):
        tree = Supervisor(
            "s",
            children=[
                Worker("w", Member, progress_deadline=1.0),
                Mesh("m", Member, shape={"procs": 2}),
            ],
        )
        placement = "procs"
        faults = ("wedge",)

    with pytest.raises(ValueError, match=r"\['s/m/0', 's/m/1'\] have no progress_deadline"):
        NoDeadline()


# ---- the per-example hooks ---------------------------------------------------------------------


class HookedTree(SupervisionMachine):
    """Records, per example, when its hooks and rules ran."""

    tree = Supervisor("s", intensity=2, children=[Worker("a", Member), Worker("b", Member)])
    examples: ClassVar[list[list[str]]] = []

    def __init__(self) -> None:
        self.seen: list[str] = []
        HookedTree.examples.append(self.seen)
        super().__init__()

    async def setup_app(self, app: App) -> None:
        # The tree has started: its workers answer.
        self.seen.append(f"setup, {await app.actor('s/a').ping()} answers")

    async def teardown_app(self, app: App) -> None:
        running = "s/b" in self.running()
        self.seen.append(f"teardown, s/b {await app.actor('s/b').ping() if running else 'gone'}")

    @rule()
    def a_rule(self) -> None:
        self.seen.append("rule")

    @invariant()
    def set_up_once_before_any_rule(self) -> None:
        assert self.seen[0] == "setup, s/a answers"
        assert self.seen.count(self.seen[0]) == 1


def test_the_setup_hook_runs_once_per_example_before_any_rule() -> None:
    HookedTree.examples.clear()
    run_state_machine_as_test(
        HookedTree, settings=settings(FAST, max_examples=8, stateful_step_count=5, database=None)
    )
    assert len(HookedTree.examples) >= 8
    for seen in HookedTree.examples:
        assert seen[0] == "setup, s/a answers"
        assert seen[-1] in ("teardown, s/b s/b", "teardown, s/b gone")
        assert seen.count(seen[0]) == 1 and sum(s.startswith("teardown") for s in seen) == 1


def test_a_failing_setup_hook_stops_the_app_and_says_so() -> None:
    class BadSetup(SupervisionMachine):
        tree = Supervisor("bad", children=[Worker("w", Member)])

        async def setup_app(self, app: App) -> None:
            raise RuntimeError("no fixtures today")

    with pytest.raises(RuntimeError, match="no fixtures today"):
        BadSetup()
    assert not [t for t in threading.enumerate() if t.name == "otpmesh-machine-bad"]


# ---- misuse is explained ---------------------------------------------------------------------


def test_a_machine_without_a_tree_says_how_to_give_one() -> None:
    class NoTree(SupervisionMachine):
        pass

    with pytest.raises(TypeError, match=r"NoTree.tree must be a Supervisor or Mesh spec"):
        NoTree()


def test_a_call_endpoint_the_actors_lack_is_named_with_the_ones_they_have() -> None:
    class Wrong(SupervisionMachine):
        tree = Supervisor("s", children=[Worker("e", Echo)])

    with pytest.raises(ValueError, match=r"call_endpoint='ping'.*s/e \(Echo\).*'echo'"):
        Wrong()


def test_unknown_faults_are_rejected_with_the_known_ones() -> None:
    class Meteor(SupervisionMachine):
        tree = Supervisor("s", children=[Worker("w", Member)])
        faults = ("meteor",)

    with pytest.raises(ValueError, match=r"use a non-empty subset of \('crash'"):
        Meteor()
