"""otpmesh's testing toolkit: the pytest plugin (run_app, chaos marker and seed, event logs in
failure reports), the hypothesis strategies for trees and fault schedules, the failure report of
SupervisionMachine. (The complete test file of docs/testing.md runs in tests/test_docs.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import otpmesh
import otpmesh.testing
from otpmesh import BRUTAL_KILL, LogKind, Mesh, Supervisor, Worker, chaos
from otpmesh._core._spec import walk
from otpmesh.testing import (
    Advance,
    Call,
    Crash,
    StopSupervisor,
    fault_schedules,
    simulate,
    supervision_trees,
    tree_paths,
)
from otpmesh.testing._plugin import AppRunner
from tests.actors import Member

pytest_plugins = ["pytester"]


# A self-contained test file header for pytester runs: an actor and a tree.
HEADER = """
import pytest, trio, otpmesh
from otpmesh import LogKind, Supervisor, Worker, chaos

class Pinger(otpmesh.Actor):
    @otpmesh.endpoint
    def ping(self) -> str:
        return otpmesh.context().path

tree = Supervisor("svc", intensity=3, children=[Worker("a", Pinger), Worker("b", Pinger)])
"""


def _test_file(body: str) -> str:
    return HEADER + textwrap.dedent(body)


# ---- the plugin --------------------------------------------------------------------------------


def test_otpmesh_testing_names_are_pinned() -> None:
    assert set(dir(otpmesh.testing)) >= {
        "Advance", "Call", "Crash", "FAULTS", "Simulation", "StartOutcome", "Step",
        "StopSupervisor", "SupervisionMachine", "TraceEntry", "fault_schedules", "simulate",
        "supervision_trees", "tree_paths",
    }  # fmt: skip
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        otpmesh.testing.nothing  # noqa: B018


def test_the_plugin_loads_without_hypothesis() -> None:
    script = textwrap.dedent("""
        import sys
        sys.modules["hypothesis"] = None  # as if it were not installed
        import otpmesh.testing._plugin
        import otpmesh.testing
        otpmesh.testing.simulate
        try:
            otpmesh.testing.SupervisionMachine
        except ImportError as exc:
            print(exc)
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "SupervisionMachine needs hypothesis: pip install 'otpmesh[test]'" in out.stdout


def test_run_app_runs_the_tree_in_process_under_mock_clock(run_app: AppRunner) -> None:
    tree = Supervisor("s", intensity=1, period=3600.0, children=[Worker("w", Member)])

    async def body(app: otpmesh.App) -> float:
        start = trio.current_time()
        await trio.sleep(7200.0)  # two restart periods, in no real time
        await chaos.crash(app, "s/w")
        await app.settled()
        assert await app.actor("s/w").count() == 1  # a fresh incarnation
        return trio.current_time() - start

    assert run_app(tree, body) == pytest.approx(7200.0)
    (app,) = run_app.apps
    assert [str(e.kind) for e in app.events][-2:] == ["child_terminated", "supervisor_exited"]


def test_a_failing_test_prints_the_event_log_with_the_faults(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        _test_file("""
        def test_b_survives(run_app):
            async def body(app):
                await chaos.crash(app, "svc/b", "on purpose")
                await app.settled()
                assert len(app.events.of_kind(LogKind.CHILD_EXITED)) == 0
            run_app(tree, body)
        """)
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*- otpmesh event log: svc -*",
            "*child_started*svc/a #1",
            "*fault_injected*svc/b  crash svc/b (on purpose)",
            "*child_exited*svc/b #1  crashed with ChaosCrash: on purpose",
            "*child_started*svc/b #2",
        ]
    )


def test_a_passing_test_prints_no_event_log(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        _test_file("""
        def test_fine(run_app):
            async def body(app):
                return await app.actor("svc/a").ping()
            assert run_app(tree, body) == "svc/a"
        """)
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=1)
    assert "otpmesh event log" not in result.stdout.str()


def test_the_chaos_marker_pins_the_seed_and_a_failure_prints_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        _test_file("""
        @pytest.mark.chaos(seed=1234)
        def test_pinned(chaos_seed):
            assert chaos_seed == 1234

        @pytest.mark.chaos
        def test_random_then_fails(chaos_seed):
            assert chaos_seed < 0
        """)
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*- otpmesh chaos seed -*", "chaos seed: *; replay it with @pytest.mark.chaos(seed=...)*"]
    )


def test_the_chaos_seed_option_applies_to_unpinned_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        _test_file("""
        def test_unpinned(chaos_seed):
            assert chaos_seed == 77

        @pytest.mark.chaos(seed=5)
        def test_marker_wins(chaos_seed):
            assert chaos_seed == 5
        """)
    )
    pytester.runpytest("-p", "no:cacheprovider", "--chaos-seed=77").assert_outcomes(passed=2)


def test_the_chaos_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.chaos(seed=None): an otpmesh fault-injection*"])


def test_a_failing_machine_prints_the_shrunk_schedule_and_both_logs(
    pytester: pytest.Pytester,
) -> None:
    # A model that is wrong on purpose (a crash taken for a normal exit) must be caught at the
    # first crash, shrunk to it, and reported with the schedule and both event logs.
    pytester.makepyfile(
        _test_file("""
        from hypothesis import settings
        from otpmesh.testing import SupervisionMachine

        class WrongModel(SupervisionMachine):
            tree = tree
            faults = ("crash", "stop_normal")

            def _model_reason(self, fault):
                return "normal"

        TestWrongModel = WrongModel.TestCase
        TestWrongModel.settings = settings(max_examples=50, deadline=None, database=None)
        """)
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*the event log differs from the reference model after the steps above, at entry 3",
            "*fault schedule (as replayed on the model):",
            "*Crash(path='svc/*', reason='normal')",
            "*event log (local):",
            "*>>*child_exited*svc/* #1  crashed with ChaosCrash: chaos",
            "*model's event log:",
            "*>>*child_exited*svc/* #1  stopped (normal)",
            "*state = WrongModel()",
            "*state.inject(fault='crash', path='svc/*')",
        ]
    )


# The complete test file of docs/testing.md runs in tests/test_docs.py, with every doc's code.


# ---- the strategies ----------------------------------------------------------------------------


def _depth(tree: Supervisor) -> int:
    return max(p.count("/") for p, _ in walk(tree))


@settings(max_examples=200, deadline=None)
@given(supervision_trees(Member, max_depth=2, max_children=3))
def test_supervision_trees_are_valid_specs_of_bounded_size(tree: Supervisor) -> None:
    workers, sups = tree_paths(tree)
    assert _depth(tree) <= 3  # a worker under a supervisor two levels below the root
    assert len(workers) + len(sups) <= 1 + 3 + 9 + 27
    for _, sup in sups:
        assert 1 <= len(sup.children) <= 3
        assert len({c.id for c in sup.children}) == len(sup.children)
    # Valid means the model (and so OTP) can run it: it starts and stops cleanly.
    sim = simulate(tree)
    assert not sim.alive and sim.root_exit == "shutdown"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_fault_schedules_aim_at_the_trees_own_paths(data: st.DataObject) -> None:
    tree = data.draw(supervision_trees(Member, max_depth=1, max_children=3))
    steps = data.draw(fault_schedules(tree, Member, min_steps=2, max_steps=5, advances=(1.0,)))
    workers, sups = tree_paths(tree)
    sup_paths = {p for p, _ in sups}
    assert 2 <= len(steps) <= 5
    for step in steps:
        if isinstance(step, Crash):
            assert step.path in workers or step.path.removesuffix("/dyn") in sup_paths
        elif isinstance(step, StopSupervisor):
            assert step.path in sup_paths
        elif isinstance(step, Call):
            assert step.sup in sup_paths
            assert (step.spec is not None) == (step.op == "start_child")
        else:
            assert step == Advance(1.0)
    simulate(tree, steps)  # every schedule runs on the model


def test_mesh_trees_work_with_the_machine_paths() -> None:
    tree = Supervisor("s", children=[Mesh("m", Member, shape={"procs": 2}, shutdown=BRUTAL_KILL)])
    from otpmesh.testing._trees import worker_paths

    assert worker_paths(tree) == ["s/m/0", "s/m/1"]
    assert worker_paths(tree.children[0]) == ["m/0", "m/1"]  # type: ignore[arg-type]


def test_events_of_a_run_app_are_kept_for_the_report(run_app: AppRunner) -> None:
    tree = Supervisor("k", children=[Worker("w", Member)])

    async def body(app: otpmesh.App) -> None:
        await chaos.kill(app, "k/w")
        await app.settled()

    run_app(tree, body)
    kinds = [e.kind for e in run_app.apps[0].events]
    assert LogKind.FAULT_INJECTED in kinds and kinds[-1] == LogKind.SUPERVISOR_EXITED
