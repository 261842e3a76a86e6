"""Differential tests: otpmesh's supervisor core against the REAL Erlang/OTP 25 supervisor.

Hypothesis generates trees, start plans and fault schedules; the same cases run through
``otpmesh.testing.simulate`` (a tree of cores) and through ``tests/erlang/otp_supervisor_trace
.escript`` (real ``supervisor`` and ``gen_server`` processes), and the two traces must be equal.
One Hypothesis example is a *batch* of cases run by one escript, since starting the Erlang VM
costs far more than a case. Periods are an hour, so every restart of a case falls inside the
window and nothing depends on the wall clock; the one period-expiry test sleeps for real.

Set OTPMESH_ERLANG_BATCHES to run more batches (of up to 25 cases each).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otpmesh._core import _actor
from otpmesh._core._spec import (
    ONE_FOR_ALL,
    REST_FOR_ONE,
    TEMPORARY,
    TRANSIENT,
    Shutdown,
    Supervisor,
    Worker,
)
from otpmesh.testing import (
    Advance,
    Call,
    Crash,
    StartOutcome,
    Step,
    StopSupervisor,
    fault_schedules,
    simulate,
    supervision_trees,
    tree_paths,
)
from otpmesh.testing._steps import KillSupervisor, ModelStep, Takeover

ESCRIPT = Path(__file__).parent / "erlang" / "otp_supervisor_trace.escript"
BATCHES = int(os.environ.get("OTPMESH_ERLANG_BATCHES", "8"))

pytestmark = [
    pytest.mark.erlang,
    pytest.mark.skipif(
        shutil.which("escript") is None,
        reason="Erlang/OTP is not installed ('escript' not on PATH); "
        "install it with 'apt-get install erlang-base' to run the differential tests",
    ),
]


class Actor(_actor.Actor):
    """Stands for an actor class: the core never instantiates it."""


Case = tuple[Supervisor, dict[str, list[StartOutcome]], list[ModelStep]]
CallOp = Literal["start_child", "terminate_child", "restart_child", "delete_child"]

# ---- Python -> Erlang terms -------------------------------------------------------------------


def erl(term: object) -> str:
    """Erlang source for `term`: str -> atom, tuple -> tuple, list -> list, dict -> map."""
    if isinstance(term, bool):
        return "true" if term else "false"
    if isinstance(term, str):
        return "'" + term.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(term, int):
        return str(term)
    if isinstance(term, tuple):
        return "{" + ",".join(erl(t) for t in term) + "}"
    if isinstance(term, list):
        return "[" + ",".join(erl(t) for t in term) + "]"
    if isinstance(term, dict):
        return "#{" + ",".join(f"{erl(k)}=>{erl(v)}" for k, v in term.items()) + "}"
    raise TypeError(f"no Erlang spelling for {term!r}")


def erl_shutdown(shutdown: Shutdown | float) -> object:
    return shutdown.value if isinstance(shutdown, Shutdown) else round(shutdown * 1000)


def erl_spec(spec: Supervisor | Worker) -> tuple[object, ...]:
    if isinstance(spec, Worker):
        shutdown = erl_shutdown(spec.shutdown)
        return ("worker", spec.id, spec.restart.value, shutdown, spec.significant)
    flags = {
        "strategy": spec.strategy.value,
        "intensity": spec.intensity,
        "period": round(spec.period),
        "auto_shutdown": spec.auto_shutdown.value,
    }
    children = [erl_spec(c) for c in spec.children if isinstance(c, Supervisor | Worker)]
    return ("sup", spec.id, flags, spec.restart.value, spec.significant, children)


def erl_step(step: Step) -> tuple[object, ...]:
    if isinstance(step, Crash):
        return ("crash", step.path, step.reason)
    if isinstance(step, StopSupervisor):
        return ("stop_sup", step.path, step.reason)
    if isinstance(step, KillSupervisor):
        return ("kill_sup", step.path)
    if isinstance(step, Advance):
        return ("sleep", round(step.seconds * 1000))
    if step.op == "start_child":
        if not isinstance(step.spec, Worker):
            raise TypeError("the escript starts dynamic workers only")
        return ("call", step.sup, "start_child", erl_spec(step.spec))
    return ("call", step.sup, step.op, step.id)


def otp_steps(steps: list[ModelStep]) -> list[Step]:
    """What OTP, which has no controller, sees of `steps`: a takeover's lost workers exit."""
    out: list[Step] = []
    for step in steps:
        if isinstance(step, Takeover):
            out += [Crash(path, step.reason) for path in step.lost]
        else:
            out.append(step)
    return out


def as_tuples(value: object) -> object:
    return tuple(as_tuples(v) for v in value) if isinstance(value, list) else value


def run_erlang(cases: list[Case]) -> list[list[object]]:
    """Run `cases` on the real OTP supervisor; one trace (list of tuples) per case."""
    terms = [
        (erl_spec(tree), list(plans.items()), [erl_step(s) for s in otp_steps(steps)])
        for tree, plans, steps in cases
    ]
    result = subprocess.run(
        ["escript", str(ESCRIPT)],
        input=erl(terms) + ".\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"escript failed ({result.returncode}):\n{result.stderr[-3000:]}")
    lines = result.stdout.splitlines()
    assert len(lines) == len(cases), result.stdout[-2000:]
    return [list(as_tuples(json.loads(line))) for line in lines]  # type: ignore[call-overload]


def run_otpmesh(case: Case) -> list[object]:
    tree, plans, steps = case
    return list(simulate(tree, steps, start_plans=plans).trace)


def assert_same(cases: list[Case]) -> None:
    for case, theirs in zip(cases, run_erlang(cases), strict=True):
        ours = run_otpmesh(case)
        if ours != theirs:
            lines = [f"{'':>3} {'otpmesh':<60} erlang"]
            for i in range(max(len(ours), len(theirs))):
                a = repr(ours[i]) if i < len(ours) else "-"
                b = repr(theirs[i]) if i < len(theirs) else "-"
                lines.append(f"{i:>3} {a:<60} {b}{'' if a == b else '   <<<'}")
            pytest.fail(f"traces differ for case {case!r}\n" + "\n".join(lines))


# ---- generated cases --------------------------------------------------------------------------

OUTCOMES: list[StartOutcome] = ["ok", "ok", "ok", "ok", "ignore", ("error", "nope")]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    tree = draw(supervision_trees(Actor))
    workers, sups = tree_paths(tree)
    planned = draw(st.lists(st.sampled_from(workers + [f"{p}/dyn" for p, _ in sups]), max_size=3))
    plans = {p: draw(st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=3)) for p in planned}
    return tree, plans, draw(fault_schedules(tree, Actor))


@settings(
    max_examples=BATCHES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(cases(), min_size=1, max_size=25))
def test_core_matches_real_otp_supervisor_on_generated_trees(batch: list[Case]) -> None:
    assert_same(batch)


@st.composite
def cases_with_takeovers(draw: st.DrawFn) -> Case:
    """A generated case whose controller dies and is taken over at drawn steps, each time
    with at most one worker dying in the gap."""
    tree, plans, steps = draw(cases())
    workers, sups = tree_paths(tree)
    with_takeovers: list[ModelStep] = list(steps)
    for _ in range(draw(st.integers(1, 3))):
        lost = draw(st.lists(st.sampled_from(workers + [f"{p}/dyn" for p, _ in sups]), max_size=1))
        reason = draw(st.sampled_from(["killed", "normal", "boom"]))
        with_takeovers.insert(draw(st.integers(0, len(steps))), Takeover(tuple(lost), reason))
    return tree, plans, with_takeovers


@settings(
    max_examples=BATCHES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(cases_with_takeovers(), min_size=1, max_size=25))
def test_a_takeover_at_any_step_agrees_with_the_real_otp_supervisor(batch: list[Case]) -> None:
    """The controller SIGKILLed at drawn steps and a standby resuming from the journal: the
    joined trace (every start, exit and reply, and the order of the last exits, which shows
    the final child lists) is OTP's for the same case, where only the gap's deaths happen."""
    assert_same(batch)


# ---- hand-written scenarios for what generated schedules rarely reach -------------------------


def test_restarts_older_than_the_period_are_forgotten_like_otp() -> None:
    """The one test that needs the wall clock: period 1 s, crashes 2.1 s apart survive."""
    tree = Supervisor("root", intensity=1, period=1.0, children=[Worker("w0", Actor)])
    spaced: list[Step] = [Crash("root/w0"), Advance(2.1), Crash("root/w0"), Advance(2.1)]
    burst: list[Step] = [Crash("root/w0"), Crash("root/w0")]
    assert_same([(tree, {}, [*spaced, Crash("root/w0")]), (tree, {}, burst)])
    assert simulate(tree, burst, stop=False).root_exit == "shutdown"
    assert simulate(tree, spaced, stop=False).alive


def test_supervisor_steps_leave_a_worker_that_took_a_gone_supervisors_id_alone() -> None:
    """Hypothesis found it in CI: a temporary supervisor stops, a dynamic worker is started
    with its id, then "stop the supervisor at that path" came. The model leaves a worker there
    alone, and so does the escript now (it stopped the worker, which exited 'normal')."""
    sub = Supervisor("s2", restart=TEMPORARY, children=[Worker("w0", Actor)])
    tree = Supervisor("root", children=[Supervisor("s1", children=[sub, Worker("w1", Actor)])])
    taker = Worker("s2", Actor, restart=TEMPORARY, shutdown=1.0)
    steps: list[Step] = [
        StopSupervisor("root/s1/s2", "normal"),
        Call("root/s1", "start_child", spec=taker),
        StopSupervisor("root/s1/s2", "normal"),
        KillSupervisor("root/s1/s2"),
        Call("root/s1/s2", "terminate_child", id="w0"),
    ]
    assert_same([(tree, {}, steps)])
    assert simulate(tree, steps, stop=False).alive


def test_dynamic_children_outcomes_match_otp() -> None:
    tree = Supervisor(
        "root",
        intensity=3,
        period=3600.0,
        children=[Worker("w0", Actor), Worker("w1", Actor, restart=TRANSIENT)],
    )
    dyn = Worker("dyn", Actor, shutdown=1.0)
    steps: list[Step] = [
        Call("root", "start_child", spec=dyn),  # start fails
        Call("root", "start_child", spec=dyn),  # start ignored: kept, not running
        Call("root", "start_child", spec=dyn),
        Call("root", "restart_child", id="dyn"),
        Call("root", "start_child", spec=dyn),
        Call("root", "terminate_child", id="dyn"),
        Call("root", "delete_child", id="dyn"),
        Call("root", "restart_child", id="dyn"),
        Crash("root/w1", ("shutdown", "done")),
        Call("root", "delete_child", id="w0"),
        Call("root", "restart_child", id="w1"),
        Call("root", "terminate_child", id="nope"),
    ]
    plans: dict[str, list[StartOutcome]] = {"root/dyn": [("error", "nope"), "ignore", "ok"]}
    assert_same([(tree, plans, steps)])
    replies = [e[3] for e in simulate(tree, steps, start_plans=plans).trace if e[0] == "reply"]
    assert replies == [
        ("start_error", "nope"),
        "ignored",
        "already_present",
        "ok",
        "already_started",
        "ok",
        "ok",
        "not_found",
        "running",
        "ok",
        "not_found",
    ]


def test_initial_start_failure_deep_in_the_tree_matches_otp() -> None:
    inner = Supervisor("s0", children=[Worker("w0", Actor), Worker("w1", Actor)])
    tree = Supervisor("root", children=[Worker("w0", Actor), inner, Worker("w2", Actor)])
    assert_same([(tree, {"root/s0/w1": [("error", "bad")]}, [])])


# ---- a supervisor stopped with a reason, or killed (OTP's sys:terminate / exit(Sup, kill)) -----


def _stopped_sub(parent: Supervisor, **sub: object) -> Supervisor:
    """`parent` with a nested supervisor 'sub' (of two workers) between two workers."""
    inner = Supervisor("sub", children=[Worker("a", Actor), Worker("b", Actor)], **sub)  # type: ignore[arg-type]
    return Supervisor(
        parent.id,
        strategy=parent.strategy,
        intensity=3,
        period=3600.0,
        children=[Worker("w0", Actor), inner, Worker("w2", Actor)],
    )


PARENTS = [Supervisor("root"), Supervisor("root", strategy=ONE_FOR_ALL)]
PARENTS.append(Supervisor("root", strategy=REST_FOR_ONE))


def test_a_supervisor_stopped_with_a_reason_gives_otps_outcome() -> None:
    """It stops its children in its order, exits with the reason, and its parent reacts as OTP's
    does: a permanent one is restarted for any reason; a transient one only for an abnormal
    reason; a temporary one never. Twice in a row reaches the parent's intensity too."""
    cases: list[Case] = []
    for parent in PARENTS:
        for restart in (None, TRANSIENT, TEMPORARY):
            flags = {} if restart is None else {"restart": restart}
            tree = _stopped_sub(parent, **flags)
            for reason in ("boom", "shutdown", "normal", ("shutdown", "done")):
                steps: list[Step] = [StopSupervisor("root/sub", reason), Crash("root/w2")]
                cases.append((tree, {}, steps))
            cases.append((tree, {}, [StopSupervisor("root/sub", "boom")] * 4))
    assert_same(cases)
    trace = run_otpmesh(cases[0])  # one_for_one, permanent, 'boom': stopped in order, restarted
    at = trace.index(("exit", "root/sub/b", "shutdown"))
    assert trace[at : at + 5] == [
        ("exit", "root/sub/b", "shutdown"),
        ("exit", "root/sub/a", "shutdown"),
        ("exit", "root/sub", "boom"),
        ("sup_start", "root/sub"),
        ("start", "root/sub/a", "ok"),
    ]


def _killed_apart(trace: list[object], killed: str) -> tuple[list[object], list[object]]:
    """The exits of what died under the killed supervisor (concurrently: in no defined order,
    and in OTP they may come after its parent already started it again), sorted; and the rest
    of the trace, in order."""
    under = [e for e in trace if _killed_under(e, killed)]
    return sorted(under, key=repr), [e for e in trace if not _killed_under(e, killed)]


def _killed_under(entry: object, killed: str) -> bool:
    return (
        isinstance(entry, tuple)
        and entry[0] == "exit"
        and str(entry[1]).startswith(killed + "/")
        and entry[2] == "killed"
    )


def test_a_killed_supervisor_gives_otps_outcome() -> None:
    """exit(Sup, kill): its workers die at once with 'killed', it exits 'killed', and its
    parent applies its strategy (restart for permanent and transient, nothing for temporary).
    otpmesh's chaos.kill does the same through the trio driver (tests/test_chaos.py)."""
    cases: list[Case] = []
    for parent in PARENTS:
        for restart in (None, TRANSIENT, TEMPORARY):
            flags = {} if restart is None else {"restart": restart}
            tree = _stopped_sub(parent, **flags)
            cases.append((tree, {}, [KillSupervisor("root/sub"), Crash("root/w0")]))
            cases.append((tree, {}, [KillSupervisor("root/sub")] * 4))
    for case, theirs in zip(cases, run_erlang(cases), strict=True):
        ours = run_otpmesh(case)
        assert _killed_apart(ours, "root/sub") == _killed_apart(theirs, "root/sub"), case
    trace = run_otpmesh(cases[0])  # one_for_one, permanent: restarted, as after any exit
    assert ("exit", "root/sub", "killed") in trace
    assert trace.count(("sup_start", "root/sub")) == 2
