"""The project's own use of ``otpmesh.testing.SupervisionMachine``: hypothesis throws crashes,
clean exits and kills (and calls) at running trees, and after every step the event log must be
the reference model's, every worker the model says runs must answer, every other one must be
reported dead at once, and no call may hang; after each example no worker process may remain.

In-process trees run hundreds of examples under MockClock; one tree runs over real worker
processes with real SIGKILLs, fewer examples."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

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
