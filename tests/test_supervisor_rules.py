"""One test per OTP 25 supervisor rule (numbers refer to docs/otp-rules.md).

Single-supervisor rules drive one SupervisorCore with a tiny driver (starts succeed unless a plan
says otherwise, stops are obeyed at once); tree rules use otpmesh.testing.simulate.
"""

from __future__ import annotations

from collections import deque

import pytest

from otpmesh._core import _actor
from otpmesh._core._children import ChildStatus
from otpmesh._core._intensity import add_restart, intensity_exceeded
from otpmesh._core._reasons import is_normal_exit
from otpmesh._core._spec import (
    ALL_SIGNIFICANT,
    ANY_SIGNIFICANT,
    BRUTAL_KILL,
    ESCALATE,
    INFINITY,
    ONE_FOR_ALL,
    REST_FOR_ONE,
    TEMPORARY,
    TRANSIENT,
    Mesh,
    Supervisor,
    Worker,
)
from otpmesh._core._spec_errors import SupervisorProtocolError
from otpmesh._core._supervisor import SupervisorCore
from otpmesh._core._supevents import (
    ChildExited,
    ChildStarted,
    ChildTerminated,
    Command,
    DeleteChildRequest,
    Event,
    Exit,
    InitDone,
    InitFailed,
    LogKind,
    Outcome,
    Reply,
    RestartChildRequest,
    StartChild,
    StartChildRequest,
    StartFailed,
    StartIgnored,
    Stop,
    TerminateChild,
    TerminateChildRequest,
)
from otpmesh.testing import Call, Crash, Step, StopSupervisor, simulate


class A(_actor.Actor):
    """An actor class; the core never instantiates it."""


def w(child_id: str, **kw: object) -> Worker:
    return Worker(child_id, A, **kw)  # type: ignore[arg-type]


def sup(*children: Worker | Supervisor, **kw: object) -> Supervisor:
    return Supervisor("s", children=children, **kw)  # type: ignore[arg-type]


class Driver:
    """Drives one core: every start succeeds unless `plans[id]` says otherwise, every stop is
    obeyed at once. `actions` records what the core asked for, in order."""

    def __init__(self, spec: Supervisor, plans: dict[str, list[object]] | None = None) -> None:
        self.core = SupervisorCore(spec)
        self.plans = {k: deque(v) for k, v in (plans or {}).items()}
        self.now = 0.0
        self.actions: list[tuple[object, ...]] = []
        self.manual = False  # leave TerminateChild unanswered, to inject races
        self.run(self.core.start(self.now))

    def run(self, commands: list[Command]) -> None:
        pending = deque(commands)
        while pending:
            cmd = pending.popleft()
            if isinstance(cmd, StartChild):
                self.actions.append(("start", cmd.id, cmd.incarnation))
                plan = self.plans.get(cmd.id)
                result = plan.popleft() if plan else "ok"
                event: Event
                if result == "ok":
                    event = ChildStarted(cmd.id)
                elif result == "ignore":
                    event = StartIgnored(cmd.id)
                else:
                    event = StartFailed(cmd.id, result)
                pending.extend(self.core.handle(event, self.now))
            elif isinstance(cmd, TerminateChild):
                self.actions.append(("terminate", cmd.id, cmd.incarnation))
                if self.manual:
                    continue
                reason = "killed" if cmd.shutdown is BRUTAL_KILL else "shutdown"
                pending.extend(
                    self.core.handle(ChildTerminated(cmd.id, cmd.incarnation, reason), self.now)
                )
            elif isinstance(cmd, Reply):
                self.actions.append(("reply", cmd.outcome, cmd.reason))
            elif isinstance(cmd, InitDone):
                self.actions.append(("init_done",))
            elif isinstance(cmd, InitFailed | Exit):
                self.actions.append(("exit", cmd.reason))

    def feed(self, event: Event, at: float | None = None) -> list[tuple[object, ...]]:
        """Feed `event`; return the actions it caused."""
        if at is not None:
            self.now = at
        before = len(self.actions)
        self.run(self.core.handle(event, self.now))
        return self.actions[before:]

    def crash(
        self, child_id: str, reason: object = "boom", at: float | None = None
    ) -> list[tuple[object, ...]]:
        inc = next(c.incarnation for c in self.core.which_children() if c.id == child_id)
        return self.feed(ChildExited(child_id, inc, reason), at)

    def status(self) -> dict[str, ChildStatus]:
        return {c.id: c.status for c in reversed(self.core.which_children())}

    def kinds(self) -> list[str]:
        return [e.kind.value for e in self.core.take_log()]


def ids(actions: list[tuple[object, ...]], kind: str) -> list[object]:
    return [a[1] for a in actions if a[0] == kind]


# ---- 1.2 starting -----------------------------------------------------------------------------


def test_children_start_one_at_a_time_in_list_order() -> None:  # rule 4
    core = SupervisorCore(sup(w("a"), w("b"), w("c")))
    assert core.start(0.0) == [StartChild("a", 1, w("a"))]
    assert core.handle(ChildStarted("a"), 0.0) == [StartChild("b", 1, w("b"))]
    assert core.handle(ChildStarted("b"), 0.0) == [StartChild("c", 1, w("c"))]
    assert core.handle(ChildStarted("c"), 0.0) == [InitDone()]


def test_subtrees_start_depth_first_before_the_next_sibling() -> None:  # rule 4
    tree = sup(w("a"), Supervisor("t", children=[w("x"), w("y")]), w("b"))
    starts = [e[1] for e in simulate(tree, stop=False).trace]
    assert starts == ["s", "s/a", "s/t", "s/t/x", "s/t/y", "s/b"]


def test_ignored_start_keeps_the_spec_not_running() -> None:  # rule 5
    d = Driver(sup(w("a"), w("b")), {"a": ["ignore"]})
    assert d.status() == {"a": ChildStatus.UNDEFINED, "b": ChildStatus.RUNNING}


def test_ignored_start_of_a_temporary_child_drops_its_spec() -> None:  # rule 5
    d = Driver(sup(w("a", restart=TEMPORARY), w("b")), {"a": ["ignore"]})
    assert d.status() == {"b": ChildStatus.RUNNING}


def test_initial_start_failure_stops_started_children_in_reverse_and_fails() -> None:  # rule 6
    d = Driver(sup(w("a"), w("b"), w("c"), w("d")), {"c": ["bad"]})
    assert d.actions == [
        ("start", "a", 1),
        ("start", "b", 1),
        ("start", "c", 1),
        ("terminate", "b", 1),
        ("terminate", "a", 1),
        ("exit", ("shutdown", ("failed_to_start_child", "c", "bad"))),
    ]
    assert d.core.done


def test_initial_start_failure_nests_through_child_supervisors() -> None:  # rule 6
    tree = sup(w("a"), Supervisor("t", children=[w("x")]))
    sim = simulate(tree, start_plans={"s/t/x": [("error", "bad")]})
    inner = ("shutdown", ("failed_to_start_child", "x", "bad"))
    assert sim.root_exit == ("shutdown", ("failed_to_start_child", "t", inner))
    assert sim.trace[-2:] == [("exit", "s/a", "shutdown"), ("root_init_failed", sim.root_exit)]


# ---- 1.3 stopping -----------------------------------------------------------------------------


def test_children_are_terminated_newest_first_one_at_a_time() -> None:  # rule 8
    core = SupervisorCore(sup(w("a"), w("b"), w("c")))
    core.start(0.0)
    for child_id in "abc":
        core.handle(ChildStarted(child_id), 0.0)
    assert core.handle(Stop(), 1.0) == [TerminateChild("c", 1, 5.0)]
    assert core.handle(Stop("ignored while busy"), 1.0) == []  # queued, like OTP's mailbox
    assert core.handle(ChildTerminated("c", 1, "shutdown"), 1.0) == [TerminateChild("b", 1, 5.0)]
    assert core.handle(ChildTerminated("b", 1, "shutdown"), 1.0) == [TerminateChild("a", 1, 5.0)]
    assert core.handle(ChildTerminated("a", 1, "shutdown"), 1.0) == [Exit("shutdown")]


def test_shutdown_spec_is_passed_to_the_driver() -> None:  # rule 9
    d = Driver(sup(w("a", shutdown=BRUTAL_KILL), w("b", shutdown=INFINITY), w("c", shutdown=2)))
    commands = d.core.handle(Stop(), 0.0)
    commands += d.core.handle(ChildTerminated("c", 1, "shutdown"), 0.0)
    commands += d.core.handle(ChildTerminated("b", 1, "shutdown"), 0.0)
    commands += d.core.handle(ChildTerminated("a", 1, "killed"), 0.0)
    assert commands == [
        TerminateChild("c", 1, 2.0),
        TerminateChild("b", 1, INFINITY),
        TerminateChild("a", 1, BRUTAL_KILL),
        Exit("shutdown"),
    ]
    assert "shutdown_error" not in d.kinds()


def test_unexpected_reason_while_being_terminated_is_only_reported() -> None:  # rule 10
    d = Driver(sup(w("a"), w("b"), strategy=ONE_FOR_ALL, intensity=5))
    d.manual = True
    d.crash("a")
    assert d.core.awaiting == TerminateChild("b", 1, 5.0)
    d.manual = False
    # b crashed by itself just before the stop reached it: the driver reports that reason.
    d.feed(ChildExited("b", 1, "own_crash"))  # the spontaneous exit is queued ...
    d.run(d.core.handle(ChildTerminated("b", 1, "own_crash"), 0.0))  # ... the stop completes
    assert d.status() == {"a": ChildStatus.RUNNING, "b": ChildStatus.RUNNING}
    assert ids(d.actions, "start") == ["a", "b", "a", "b"]  # one group restart, not two
    assert "shutdown_error" in d.kinds()


def test_exit_queued_before_a_group_stop_is_consumed_not_restarted_twice() -> None:  # 10, 21
    d = Driver(sup(w("a"), w("b"), w("c"), strategy=ONE_FOR_ALL, intensity=5))
    d.manual = True
    d.crash("c")  # terminating b now ...
    d.feed(ChildExited("a", 1, "boom"))  # ... while a dies: its exit waits in the mailbox
    d.manual = False
    d.run(d.core.handle(ChildTerminated("b", 1, "shutdown"), 0.0))
    # a was not running any more: OTP's unlink_flush picks its exit up, no TerminateChild
    assert ids(d.actions, "terminate") == ["b"]
    assert ids(d.actions, "start")[3:] == ["a", "b", "c"]
    assert d.core.restarts == (0.0,)


def test_nested_supervisors_stop_depth_first() -> None:  # rule 11
    tree = sup(w("a"), Supervisor("t", children=[w("x"), w("y")]), w("b"))
    sim = simulate(tree)
    exits = [e[1] for e in sim.trace if e[0] == "exit"]
    assert exits == ["s/b", "s/t/y", "s/t/x", "s/t", "s/a", "s"]


def test_terminated_temporary_child_spec_is_deleted() -> None:  # rule 12
    d = Driver(sup(w("a", restart=TEMPORARY), w("b")))
    d.feed(TerminateChildRequest(1, "a"))
    d.feed(TerminateChildRequest(2, "b"))
    assert d.status() == {"b": ChildStatus.UNDEFINED}


def test_stop_terminates_all_children_then_exits_with_the_reason() -> None:  # rule 13
    d = Driver(sup(w("a"), w("b")))
    assert d.feed(Stop("bye")) == [("terminate", "b", 1), ("terminate", "a", 1), ("exit", "bye")]


# ---- 1.4 restart types ------------------------------------------------------------------------

ALL_REASONS = ["normal", "shutdown", ("shutdown", "x"), "killed", "boom"]


@pytest.mark.parametrize("reason", ALL_REASONS)
def test_permanent_child_is_restarted_after_any_exit(reason: object) -> None:  # rule 14
    d = Driver(sup(w("a")))
    assert d.crash("a", reason) == [("start", "a", 2)]


@pytest.mark.parametrize("reason", ALL_REASONS)
def test_transient_child_is_restarted_only_after_an_abnormal_exit(reason: object) -> None:  # 15
    d = Driver(sup(w("a", restart=TRANSIENT)))
    restarted = d.crash("a", reason) == [("start", "a", 2)]
    assert restarted is not is_normal_exit(reason)
    assert d.status()["a"] is ChildStatus.RUNNING if restarted else ChildStatus.UNDEFINED


@pytest.mark.parametrize("reason", ALL_REASONS)
def test_temporary_child_is_never_restarted_and_its_spec_dropped(reason: object) -> None:  # 16
    d = Driver(sup(w("a", restart=TEMPORARY), w("b")))
    assert d.crash("a", reason) == []
    assert d.status() == {"b": ChildStatus.RUNNING}
    assert d.feed(RestartChildRequest(1, "a")) == [("reply", Outcome.NOT_FOUND, None)]
    assert d.feed(StartChildRequest(2, w("a"))) == [("start", "a", 2), ("reply", Outcome.OK, None)]


def test_exit_that_is_not_restarted_neither_counts_nor_touches_siblings() -> None:  # rule 17
    d = Driver(sup(w("a", restart=TRANSIENT), w("b"), strategy=ONE_FOR_ALL, intensity=0))
    assert d.crash("a", "normal") == []
    assert d.core.restarts == ()
    assert d.status() == {"a": ChildStatus.UNDEFINED, "b": ChildStatus.RUNNING}


def test_exit_of_a_stale_incarnation_is_ignored() -> None:  # rule 18
    d = Driver(sup(w("a")))
    d.crash("a")
    assert d.feed(ChildExited("a", 1, "late")) == []
    assert d.feed(ChildExited("nobody", 1, "late")) == []


# ---- 1.5 strategies ---------------------------------------------------------------------------


def test_one_for_one_restarts_only_the_exited_child() -> None:  # rule 20
    d = Driver(sup(w("a"), w("b"), w("c")))
    assert d.crash("b") == [("start", "b", 2)]


def test_one_for_all_stops_the_others_newest_first_then_starts_all_in_order() -> None:  # 19, 21
    d = Driver(sup(w("a"), w("b"), w("c"), strategy=ONE_FOR_ALL, intensity=1))
    assert d.crash("b") == [
        ("terminate", "c", 1),
        ("terminate", "a", 1),
        ("start", "a", 2),
        ("start", "b", 2),
        ("start", "c", 2),
    ]
    assert len(d.core.restarts) == 1  # one restart, however many children


def test_rest_for_one_restarts_later_siblings_in_start_order() -> None:  # rule 22
    d = Driver(sup(w("a"), w("b"), w("c"), w("d"), strategy=REST_FOR_ONE, intensity=5))
    assert d.crash("b") == [
        ("terminate", "d", 1),
        ("terminate", "c", 1),
        ("start", "b", 2),
        ("start", "c", 2),
        ("start", "d", 2),
    ]
    assert d.crash("d") == [("start", "d", 3)]  # the last child: same as one_for_one


def test_temporary_bystander_is_stopped_not_restarted_and_dropped() -> None:  # rule 23
    d = Driver(sup(w("a"), w("t", restart=TEMPORARY), strategy=ONE_FOR_ALL))
    assert d.crash("a") == [("terminate", "t", 1), ("start", "a", 2)]
    assert d.status() == {"a": ChildStatus.RUNNING}


def test_group_restart_also_starts_siblings_that_were_not_running() -> None:  # rule 24
    d = Driver(
        sup(w("a"), w("b", restart=TRANSIENT), w("c"), w("d"), strategy=REST_FOR_ONE, intensity=5),
        {"d": ["ok", "ignore"]},
    )
    d.crash("b", "normal")  # transient, normal: stays stopped
    d.feed(TerminateChildRequest(1, "c"))  # stopped by request
    assert d.crash("a") == [
        ("terminate", "d", 1),
        ("start", "a", 2),
        ("start", "b", 2),
        ("start", "c", 2),
        ("start", "d", 2),
    ]
    assert d.status()["d"] is ChildStatus.UNDEFINED  # ignored this time
    assert d.crash("c") == [("start", "c", 3), ("start", "d", 3)]


def test_dynamic_children_are_started_last_and_stopped_first() -> None:  # rules 25, 39
    d = Driver(sup(w("a"), w("b"), strategy=ONE_FOR_ALL))
    d.feed(StartChildRequest(1, w("z")))
    assert d.crash("a")[:2] == [("terminate", "z", 1), ("terminate", "b", 1)]
    assert ids(d.actions, "start")[-3:] == ["a", "b", "z"]


def test_ignore_during_a_restart_leaves_the_child_stopped_without_retry() -> None:  # rule 26
    d = Driver(sup(w("a"), intensity=5), {"a": ["ok", "ignore"]})
    assert d.crash("a") == [("start", "a", 2)]
    assert d.status() == {"a": ChildStatus.UNDEFINED}
    assert d.core.idle


# ---- 1.6 intensity ----------------------------------------------------------------------------


def test_add_restart_keeps_stamps_within_period_inclusive() -> None:  # rule 27
    assert add_restart((), 10.0, 5.0) == (10.0,)
    assert add_restart((10.0, 5.0, 4.9), 10.0, 5.0) == (10.0, 10.0, 5.0)
    assert intensity_exceeded((1.0, 1.0), 1) and not intensity_exceeded((1.0,), 1)


def test_intensity_restarts_within_period_are_tolerated_the_next_is_fatal() -> None:  # rule 27
    d = Driver(sup(w("a"), intensity=2, period=10))
    d.crash("a", at=0.0)
    d.crash("a", at=5.0)
    assert d.crash("a", at=10.0) == [("exit", "shutdown")]  # 0.0 is still inside: 10 - 0 <= 10
    assert d.kinds()[-2:] == ["restart_intensity_reached", "supervisor_exited"]


def test_restart_just_outside_the_period_is_forgotten() -> None:  # rule 27
    d = Driver(sup(w("a"), intensity=2, period=10))
    for incarnation, t in enumerate((0.0, 5.0, 10.5, 16.0), start=2):  # 16 - 5 > 10
        assert d.crash("a", at=t) == [("start", "a", incarnation)]
    assert d.core.restarts == (16.0, 10.5)


def test_intensity_zero_gives_up_on_the_first_restart() -> None:  # rule 27
    assert Driver(sup(w("a"), intensity=0)).crash("a") == [("exit", "shutdown")]


def test_giving_up_stops_the_rest_newest_first_and_exits_with_shutdown() -> None:  # rule 28
    d = Driver(sup(w("a"), w("b"), w("c"), intensity=0))
    assert d.crash("b", "boom") == [
        ("terminate", "c", 1),
        ("terminate", "a", 1),
        ("exit", "shutdown"),
    ]
    kinds = d.kinds()
    assert kinds[-4:] == [
        "restart_intensity_reached",
        "child_terminated",
        "child_terminated",
        "supervisor_exited",
    ]


# ---- 1.7 start failure during a restart -------------------------------------------------------


def test_failed_restart_is_retried_and_every_attempt_counts() -> None:  # rule 29
    d = Driver(sup(w("a"), w("b"), intensity=3), {"a": ["ok", "e1", "e2", "ok"]})
    assert d.crash("a") == [("start", "a", 2), ("start", "a", 3), ("start", "a", 4)]
    assert len(d.core.restarts) == 3
    assert d.status() == {"a": ChildStatus.RUNNING, "b": ChildStatus.RUNNING}


def test_child_that_never_starts_again_exhausts_intensity() -> None:  # rule 29
    d = Driver(sup(w("a"), w("b"), intensity=2), {"a": ["ok", "e", "e", "e", "e"]})
    assert d.crash("a") == [
        ("start", "a", 2),
        ("start", "a", 3),
        ("terminate", "b", 1),
        ("exit", "shutdown"),
    ]


def test_requests_between_retries_see_the_child_restarting() -> None:  # rule 29
    core = SupervisorCore(sup(w("a"), intensity=5))
    core.start(0.0)
    core.handle(ChildStarted("a"), 0.0)
    assert core.handle(ChildExited("a", 1, "boom"), 0.0) == [StartChild("a", 2, w("a"))]
    # Requests arriving during the attempt queue up behind OTP's try_again_restart cast.
    assert core.handle(RestartChildRequest("r", "a"), 0.0) == []
    assert core.handle(DeleteChildRequest("d", "a"), 0.0) == []
    assert core.handle(StartFailed("a", "nope"), 0.0) == [
        Reply("r", Outcome.RESTARTING),
        Reply("d", Outcome.RESTARTING),
        StartChild("a", 3, w("a")),
    ]


def test_terminate_child_ends_the_retry_loop() -> None:  # rule 29
    core = SupervisorCore(sup(w("a"), intensity=5))
    core.start(0.0)
    core.handle(ChildStarted("a"), 0.0)
    core.handle(ChildExited("a", 1, "boom"), 0.0)
    core.handle(TerminateChildRequest("t", "a"), 0.0)
    assert core.handle(StartFailed("a", "nope"), 0.0) == [Reply("t", Outcome.OK)]
    assert core.idle and core.which_children()[0].status is ChildStatus.UNDEFINED


def test_one_for_all_retry_restarts_the_whole_group() -> None:  # rule 30
    d = Driver(sup(w("a"), w("b"), w("c"), strategy=ONE_FOR_ALL, intensity=5), {"b": ["ok", "e"]})
    assert d.crash("c") == [
        ("terminate", "b", 1),
        ("terminate", "a", 1),
        ("start", "a", 2),
        ("start", "b", 2),  # fails: c is left stopped, b restarting
        ("terminate", "a", 2),  # the retry is a one_for_all restart "of b"
        ("start", "a", 3),
        ("start", "b", 3),
        ("start", "c", 2),
    ]
    assert len(d.core.restarts) == 2


def test_rest_for_one_retry_keeps_children_before_the_failed_one() -> None:  # rule 31
    d = Driver(sup(w("a"), w("b"), w("c"), strategy=REST_FOR_ONE, intensity=5), {"b": ["ok", "e"]})
    assert d.crash("a") == [
        ("terminate", "c", 1),
        ("terminate", "b", 1),
        ("start", "a", 2),
        ("start", "b", 2),
        ("start", "b", 3),
        ("start", "c", 2),
    ]


# ---- 1.8 escalation ---------------------------------------------------------------------------


def test_child_supervisor_giving_up_is_restarted_by_a_permanent_parent() -> None:  # rule 32
    tree = sup(w("a"), Supervisor("t", intensity=0, children=[w("x")]), intensity=1)
    sim = simulate(tree, [Crash("s/t/x")], stop=False)
    assert sim.trace[-3:] == [
        ("exit", "s/t", "shutdown"),
        ("sup_start", "s/t"),
        ("start", "s/t/x", "ok"),
    ]


def test_transient_child_supervisor_giving_up_is_not_restarted() -> None:  # rule 32
    inner = Supervisor("t", intensity=0, restart=TRANSIENT, children=[w("x")])
    sim = simulate(sup(w("a"), inner), [Crash("s/t/x")], stop=False)
    assert sim.trace[-1] == ("exit", "s/t", "shutdown")
    assert sim.running() == {"s", "s/a"}


def test_repeated_escalation_reaches_the_root() -> None:  # rule 32
    tree = sup(Supervisor("t", intensity=0, children=[w("x")]), intensity=0)
    sim = simulate(tree, [Crash("s/t/x")])
    assert sim.root_exit == "shutdown" and not sim.alive


def test_restarted_child_supervisor_rebuilds_its_static_children() -> None:  # rule 33
    tree = sup(Supervisor("t", children=[w("x"), w("tmp", restart=TEMPORARY)]), intensity=3)
    steps: list[Step] = [
        Call("s/t", "start_child", spec=w("dyn")),
        Crash("s/t/tmp"),
        StopSupervisor("s/t", "boom"),
    ]
    sim = simulate(tree, steps, stop=False)
    assert sim.running() == {"s", "s/t", "s/t/x", "s/t/tmp"}


# ---- 1.9 significant children -----------------------------------------------------------------


def test_any_significant_child_exit_shuts_the_supervisor_down() -> None:  # rule 35
    d = Driver(
        sup(
            w("a"),
            w("b", restart=TEMPORARY, significant=True),
            w("c"),
            auto_shutdown=ANY_SIGNIFICANT,
        )
    )
    assert d.crash("b", "boom") == [
        ("terminate", "c", 1),
        ("terminate", "a", 1),
        ("exit", "shutdown"),
    ]


def test_all_significant_waits_for_the_last_significant_child() -> None:  # rule 35
    d = Driver(
        sup(
            w("a", restart=TRANSIENT, significant=True),
            w("b", restart=TEMPORARY, significant=True),
            w("c"),
            auto_shutdown=ALL_SIGNIFICANT,
        )
    )
    assert d.crash("a", "normal") == []
    assert d.crash("b", "boom") == [("terminate", "c", 1), ("exit", "shutdown")]


def test_significant_transient_abnormal_exit_is_an_ordinary_restart() -> None:  # rule 36
    d = Driver(sup(w("a", restart=TRANSIENT, significant=True), auto_shutdown=ANY_SIGNIFICANT))
    assert d.crash("a", "boom") == [("start", "a", 2)]


def test_terminations_by_the_supervisor_never_trigger_auto_shutdown() -> None:  # rule 37
    d = Driver(
        sup(
            w("a", restart=TRANSIENT, significant=True),
            w("b"),
            strategy=ONE_FOR_ALL,
            auto_shutdown=ANY_SIGNIFICANT,
            intensity=5,
        )
    )
    assert d.feed(TerminateChildRequest(1, "a")) == [
        ("terminate", "a", 1),
        ("reply", Outcome.OK, None),
    ]
    d.feed(RestartChildRequest(2, "a"))
    assert ids(d.crash("b"), "start") == ["a", "b"]  # a stopped as a bystander: no shutdown
    assert not d.core.done


def test_auto_shutdown_escalates_through_significant_supervisors() -> None:  # rule 38
    inner = Supervisor(
        "t",
        restart=TRANSIENT,
        significant=True,
        auto_shutdown=ANY_SIGNIFICANT,
        children=[w("x", restart=TEMPORARY, significant=True)],
    )
    sim = simulate(sup(w("a"), inner, auto_shutdown=ANY_SIGNIFICANT), [Crash("s/t/x", "normal")])
    assert [e for e in sim.trace if e[0] == "exit"][-3:] == [
        ("exit", "s/t", "shutdown"),
        ("exit", "s/a", "shutdown"),
        ("exit", "s", "shutdown"),
    ]


# ---- 1.10 dynamic children --------------------------------------------------------------------


def test_start_child_outcomes() -> None:  # rule 39
    d = Driver(sup(w("a"), w("b")), {"b": ["ignore"], "c": ["bad"], "i": ["ignore"]})
    assert d.feed(StartChildRequest(1, w("a")))[-1] == ("reply", Outcome.ALREADY_STARTED, None)
    assert d.feed(StartChildRequest(2, w("b")))[-1] == ("reply", Outcome.ALREADY_PRESENT, None)
    assert d.feed(StartChildRequest(3, w("c")))[-1] == ("reply", Outcome.START_ERROR, "bad")
    assert "c" not in d.status()
    assert d.feed(StartChildRequest(4, w("i", restart=TEMPORARY)))[-1][1] is Outcome.IGNORED
    assert "i" not in d.status()
    bad = w("z", restart=TRANSIENT, significant=True)
    reply = d.feed(StartChildRequest(5, bad))[-1]
    assert reply[1] is Outcome.INVALID_SPEC and "auto_shutdown=NEVER" in str(reply[2])


def test_terminate_child_is_not_an_exit_event() -> None:  # rule 40
    d = Driver(sup(w("a"), w("b"), strategy=ONE_FOR_ALL, intensity=0))
    assert d.feed(TerminateChildRequest(1, "a")) == [
        ("terminate", "a", 1),
        ("reply", Outcome.OK, None),
    ]
    assert d.feed(TerminateChildRequest(2, "a")) == [("reply", Outcome.OK, None)]
    assert d.feed(TerminateChildRequest(3, "x")) == [("reply", Outcome.NOT_FOUND, None)]
    assert d.core.restarts == () and not d.core.done


def test_restart_child_outcomes() -> None:  # rule 41
    d = Driver(sup(w("a"), w("b"), intensity=0), {"b": ["ok", "bad"]})
    assert d.feed(RestartChildRequest(1, "a")) == [("reply", Outcome.RUNNING, None)]
    d.feed(TerminateChildRequest(2, "a"))
    assert d.feed(RestartChildRequest(3, "a")) == [("start", "a", 2), ("reply", Outcome.OK, None)]
    d.feed(TerminateChildRequest(4, "b"))
    assert d.feed(RestartChildRequest(5, "b"))[-1] == ("reply", Outcome.START_ERROR, "bad")
    assert d.status()["b"] is ChildStatus.UNDEFINED and d.core.restarts == ()


def test_delete_child_outcomes() -> None:  # rule 42
    d = Driver(sup(w("a")))
    assert d.feed(DeleteChildRequest(1, "a")) == [("reply", Outcome.RUNNING, None)]
    d.feed(TerminateChildRequest(2, "a"))
    assert d.feed(DeleteChildRequest(3, "a")) == [("reply", Outcome.OK, None)]
    assert d.feed(DeleteChildRequest(4, "a")) == [("reply", Outcome.NOT_FOUND, None)]


def test_which_children_lists_newest_first() -> None:  # rule 43
    d = Driver(sup(w("a"), w("b")))
    d.feed(StartChildRequest(1, w("c")))
    assert [c.id for c in d.core.which_children()] == ["c", "b", "a"]


# ---- otpmesh's ESCALATE -----------------------------------------------------------------------


def test_escalate_stops_the_group_and_exits_with_the_childs_reason() -> None:
    d = Driver(sup(w("a"), w("b"), w("c"), strategy=ESCALATE, intensity=5))
    assert d.crash("b", "cuda_error") == [
        ("terminate", "c", 1),
        ("terminate", "a", 1),
        ("exit", "cuda_error"),
    ]
    assert "escalated" in d.kinds() and d.core.restarts == ()


def test_escalate_ignores_exits_that_would_not_be_restarted() -> None:
    d = Driver(sup(w("a", restart=TRANSIENT), w("b"), strategy=ESCALATE))
    assert d.crash("a", "normal") == []
    assert not d.core.done


def test_escalated_reason_reaches_the_parent_as_a_child_exit() -> None:
    tree = sup(Supervisor("t", strategy=ESCALATE, children=[w("x")]), intensity=1)
    sim = simulate(tree, [Crash("s/t/x", "oom")], stop=False)
    assert ("exit", "s/t", "oom") in sim.trace and sim.running() == {"s", "s/t", "s/t/x"}


# ---- the driver contract ----------------------------------------------------------------------


def test_completion_for_a_command_not_issued_is_a_protocol_error() -> None:
    core = SupervisorCore(sup(w("a")))
    core.start(0.0)
    with pytest.raises(SupervisorProtocolError, match="while waiting for StartChild"):
        core.handle(ChildStarted("b"), 0.0)


def test_time_going_backwards_is_a_protocol_error() -> None:
    core = SupervisorCore(sup(w("a")))
    core.start(5.0)
    with pytest.raises(SupervisorProtocolError, match="time went backwards"):
        core.handle(ChildStarted("a"), 4.0)


def test_events_after_exit_are_refused_except_late_exits() -> None:
    d = Driver(sup(w("a")))
    d.feed(Stop())
    assert d.core.done and d.core.handle(ChildExited("a", 1, "late"), 1.0) == []
    assert d.core.handle(Stop(), 1.0) == []  # the parent's stop crossed our exit
    with pytest.raises(SupervisorProtocolError, match="after the supervisor exited"):
        d.core.handle(TerminateChildRequest(9, "a"), 1.0)


def test_every_step_is_logged_with_time_path_and_incarnation() -> None:
    d = Driver(sup(w("a")))
    d.crash("a", "boom", at=3.0)
    log = [(e.time, e.kind, e.child_path, e.incarnation, e.reason) for e in d.core.take_log()]
    assert log == [
        (0.0, LogKind.CHILD_STARTED, "s/a", 1, None),
        (0.0, LogKind.SUPERVISOR_STARTED, "s", None, None),
        (3.0, LogKind.CHILD_EXITED, "s/a", 1, "boom"),
        (3.0, LogKind.CHILD_STARTED, "s/a", 2, None),
    ]


def test_mesh_child_runs_as_a_group_of_one_worker_per_slot() -> None:
    mesh = Mesh("m", A, shape={"gpus": 3}, strategy=ONE_FOR_ALL, intensity=2)
    core = SupervisorCore(sup(mesh))
    assert core.start(0.0) == [StartChild("m", 1, mesh)]  # the driver sees the Mesh itself
    sim = simulate(sup(mesh), [Crash("s/m/1", "sigkill")], stop=False)
    assert sim.trace[-6:] == [
        ("exit", "s/m/1", "sigkill"),
        ("exit", "s/m/2", "shutdown"),
        ("exit", "s/m/0", "shutdown"),
        ("start", "s/m/0", "ok"),
        ("start", "s/m/1", "ok"),
        ("start", "s/m/2", "ok"),
    ]
