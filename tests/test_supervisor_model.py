"""Stateful property test: the supervisor core against a deliberately simple reference model.

The model is OTP's supervisor for one flat supervisor, written as plain synchronous Python: no
generators, no mailbox, no commands; a failed restart is simply retried in a loop (which is what
OTP's try_again_restart amounts to when nothing else arrives meanwhile). Hypothesis drives both
with the same faults, start results, clock and dynamic-children requests, and after every step
the actions the core asked its driver for, and the children's states, must be the model's.
"""

from __future__ import annotations

from collections import Counter, deque

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from otpmesh._core import _actor
from otpmesh._core._spec import (
    ALL_SIGNIFICANT,
    ANY_SIGNIFICANT,
    BRUTAL_KILL,
    ESCALATE,
    NEVER,
    ONE_FOR_ALL,
    ONE_FOR_ONE,
    PERMANENT,
    REST_FOR_ONE,
    TEMPORARY,
    TRANSIENT,
    AutoShutdown,
    Restart,
    Strategy,
    Supervisor,
    Worker,
)
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

Action = tuple[object, ...]
IDS = ["a", "b", "c", "d", "e"]
REASONS = ["normal", "shutdown", ("shutdown", 1), "killed", "boom"]


class Actor(_actor.Actor):
    pass


class Model:
    """OTP 25's supervisor rules for one supervisor of workers, as directly as possible."""

    def __init__(self, spec: Supervisor, plans: dict[str, deque[object]]) -> None:
        self.spec = spec
        self.plans = plans
        self.order: list[str] = []  # start order
        self.specs: dict[str, Worker] = {}
        self.running: dict[str, bool] = {}
        self.starts: Counter[str] = Counter()
        self.restarts: list[float] = []
        self.actions: list[Action] = []
        self.alive = True
        for child in spec.children:
            assert isinstance(child, Worker)
            self.order.append(child.id)
            self.specs[child.id] = child
            self.running[child.id] = False
        for child_id in list(self.order):
            result = self.start(child_id)
            if result == "ignore" and self.specs[child_id].restart is TEMPORARY:
                self.remove(child_id)
            elif result != "ok" and result != "ignore":
                self.exit(("shutdown", ("failed_to_start_child", child_id, result[1])))  # type: ignore[index]
                return
        self.actions.append(("init_done",))

    def start(self, child_id: str) -> object:
        self.starts[child_id] += 1
        self.actions.append(("start", child_id, self.starts[child_id]))
        plan = self.plans.get(child_id)
        result = plan.popleft() if plan else "ok"
        self.running[child_id] = result == "ok"
        return result

    def remove(self, child_id: str) -> None:
        self.order.remove(child_id)
        del self.specs[child_id], self.running[child_id]

    def stop(self, ids: list[str]) -> None:
        for child_id in reversed(ids):
            if self.running[child_id]:
                self.actions.append(("terminate", child_id, self.starts[child_id]))
                self.running[child_id] = False
            if self.specs[child_id].restart is TEMPORARY:
                self.remove(child_id)

    def exit(self, reason: object) -> None:
        self.stop(list(self.order))
        self.actions.append(("exit", reason))
        self.alive = False

    def too_many(self, now: float) -> bool:
        self.restarts = [t for t in self.restarts if now - t <= self.spec.period] + [now]
        return len(self.restarts) > self.spec.intensity

    def crash(self, child_id: str, reason: object, now: float) -> None:
        restart = self.specs[child_id].restart
        self.running[child_id] = False
        normal = reason in ("normal", "shutdown") or (
            isinstance(reason, tuple) and reason[0] == "shutdown"
        )
        if restart is TEMPORARY or (restart is TRANSIENT and normal):
            significant = self.specs[child_id].significant
            if restart is TEMPORARY:
                self.remove(child_id)
            mode = self.spec.auto_shutdown
            if significant and (
                mode is ANY_SIGNIFICANT
                or (
                    mode is ALL_SIGNIFICANT
                    and not any(self.specs[i].significant and self.running[i] for i in self.order)
                )
            ):
                self.exit("shutdown")
            return
        if self.spec.strategy is ESCALATE:
            self.exit(reason)
            return
        while True:  # each attempt is one restart; a failed start makes the next attempt
            if self.too_many(now):
                self.exit("shutdown")
                return
            if self.spec.strategy is ONE_FOR_ONE:
                group = [child_id]
            elif self.spec.strategy is REST_FOR_ONE:
                group = self.order[self.order.index(child_id) :]
            else:
                group = list(self.order)
            self.stop(group)
            failed = next(
                (i for i in group if i in self.specs and self.start(i) not in ("ok", "ignore")),
                None,
            )
            if failed is None:
                return
            child_id = failed

    def request(self, op: str, child_id: str, restart: Restart) -> object:
        if op == "start_child":
            if child_id in self.specs:
                return "already_started" if self.running[child_id] else "already_present"
            self.order.append(child_id)
            self.specs[child_id] = Worker(child_id, Actor, restart=restart)
            result = self.start(child_id)
            if result == "ok":
                return "ok"
            if result == "ignore" and restart is not TEMPORARY:
                return "ignored"
            self.remove(child_id)
            return "ignored" if result == "ignore" else ("start_error", result[1])  # type: ignore[index]
        if child_id not in self.specs:
            return "not_found"
        if op == "terminate_child":
            self.stop([child_id])
            return "ok"
        if self.running[child_id]:
            return "running"
        if op == "delete_child":
            self.remove(child_id)
            return "ok"
        result = self.start(child_id)
        return {"ok": "ok", "ignore": "ignored"}.get(result, ("start_error", result[1]))  # type: ignore[index,call-overload]


class CoreDriver:
    """Answers the core's commands: starts follow the plans, stops complete at once."""

    def __init__(self, spec: Supervisor, plans: dict[str, deque[object]]) -> None:
        self.core = SupervisorCore(spec)
        self.plans = plans
        self.actions: list[Action] = []
        self.now = 0.0
        self.run(self.core.start(0.0))

    def feed(self, event: Event) -> None:
        self.run(self.core.handle(event, self.now))

    def run(self, commands: list[Command]) -> None:
        pending = deque(commands)
        while pending:
            cmd = pending.popleft()
            event: Event
            if isinstance(cmd, StartChild):
                self.actions.append(("start", cmd.id, cmd.incarnation))
                plan = self.plans.get(cmd.id)
                result = plan.popleft() if plan else "ok"
                if result == "ok":
                    event = ChildStarted(cmd.id)
                elif result == "ignore":
                    event = StartIgnored(cmd.id)
                else:
                    event = StartFailed(cmd.id, result[1])  # type: ignore[index]
                pending.extend(self.core.handle(event, self.now))
            elif isinstance(cmd, TerminateChild):
                self.actions.append(("terminate", cmd.id, cmd.incarnation))
                reason = "killed" if cmd.shutdown is BRUTAL_KILL else "shutdown"
                event = ChildTerminated(cmd.id, cmd.incarnation, reason)
                pending.extend(self.core.handle(event, self.now))
            elif isinstance(cmd, Reply):
                outcome = cmd.outcome.value
                self.actions.append(
                    ("reply", ("start_error", cmd.reason) if outcome == "start_error" else outcome)
                )
            elif isinstance(cmd, InitDone):
                self.actions.append(("init_done",))
            elif isinstance(cmd, InitFailed | Exit):
                self.actions.append(("exit", cmd.reason))


START_RESULTS = st.sampled_from(["ok", "ok", "ignore", ("error", "e1"), ("error", "e2")])


@st.composite
def workers(draw: st.DrawFn, child_id: str, auto: AutoShutdown) -> Worker:
    restart = draw(st.sampled_from([PERMANENT, TRANSIENT, TEMPORARY]))
    significant = auto is not NEVER and restart is not PERMANENT and draw(st.booleans())
    return Worker(
        child_id,
        Actor,
        restart=restart,
        significant=significant,
        shutdown=draw(st.sampled_from([BRUTAL_KILL, 1.0])),  # type: ignore[arg-type]
    )


@st.composite
def supervisors(draw: st.DrawFn) -> Supervisor:
    auto = draw(st.sampled_from([NEVER, ANY_SIGNIFICANT, ALL_SIGNIFICANT]))
    n = draw(st.integers(1, 4))
    strategy: Strategy = draw(st.sampled_from([ONE_FOR_ONE, ONE_FOR_ALL, REST_FOR_ONE, ESCALATE]))
    return Supervisor(
        "s",
        strategy=strategy,
        intensity=draw(st.integers(0, 4)),
        period=draw(st.sampled_from([1.0, 5.0])),
        auto_shutdown=auto,
        children=[draw(workers(i, auto)) for i in IDS[:n]],
    )


class SupervisorMachine(RuleBasedStateMachine):
    """Faults, start results, time and requests, applied to the core and the model alike."""

    def __init__(self) -> None:
        super().__init__()
        self.model: Model
        self.driver: CoreDriver
        self.ref = 0

    @initialize(
        spec=supervisors(),
        plans=st.dictionaries(st.sampled_from(IDS), st.lists(START_RESULTS, max_size=3)),
    )
    def start(self, spec: Supervisor, plans: dict[str, list[object]]) -> None:
        self.model = Model(spec, {k: deque(v) for k, v in plans.items()})
        self.driver = CoreDriver(spec, {k: deque(v) for k, v in plans.items()})

    def plan(self, child_id: str, results: list[object]) -> None:
        for plans in (self.model.plans, self.driver.plans):
            plans.setdefault(child_id, deque()).extend(results)

    @precondition(lambda self: self.model.alive)
    @rule(
        child=st.sampled_from(IDS),
        reason=st.sampled_from(REASONS),
        next_starts=st.lists(START_RESULTS, max_size=3),
    )
    def crash(self, child: str, reason: object, next_starts: list[object]) -> None:
        self.plan(child, next_starts)
        incarnation = self.model.starts[child]
        if self.model.running.get(child):
            self.model.crash(child, reason, self.driver.now)
        # Otherwise this exit is not from a current child and must be ignored (rule 18).
        self.driver.feed(ChildExited(child, incarnation, reason))

    @rule(dt=st.sampled_from([0.0, 0.25, 1.0, 2.0, 5.0]))
    def advance(self, dt: float) -> None:
        self.driver.now += dt

    @precondition(lambda self: self.model.alive)
    @rule(
        op=st.sampled_from(["start_child", "terminate_child", "restart_child", "delete_child"]),
        child=st.sampled_from([*IDS, "x"]),
        restart=st.sampled_from([PERMANENT, TEMPORARY]),
        next_starts=st.lists(START_RESULTS, max_size=2),
    )
    def request(self, op: str, child: str, restart: Restart, next_starts: list[object]) -> None:
        self.plan(child, next_starts)
        self.ref += 1
        outcome = self.model.request(op, child, restart)
        self.model.actions.append(("reply", outcome))
        if op == "start_child":
            self.driver.feed(StartChildRequest(self.ref, Worker(child, Actor, restart=restart)))
        elif op == "terminate_child":
            self.driver.feed(TerminateChildRequest(self.ref, child))
        elif op == "restart_child":
            self.driver.feed(RestartChildRequest(self.ref, child))
        else:
            self.driver.feed(DeleteChildRequest(self.ref, child))

    @precondition(lambda self: self.model.alive)
    @rule(reason=st.sampled_from(["shutdown", "bye"]))
    def stop(self, reason: str) -> None:
        self.model.exit(reason)
        self.driver.feed(Stop(reason))

    @invariant()
    def same_actions(self) -> None:
        assert self.driver.actions == self.model.actions

    @invariant()
    def same_children(self) -> None:
        core = {c.id: c.status.value for c in reversed(self.driver.core.which_children())}
        model = {i: "running" if self.model.running[i] else "undefined" for i in self.model.order}
        assert core == model
        assert self.driver.core.done is not self.model.alive
        assert self.driver.core.done or self.driver.core.idle


SupervisorMachine.TestCase.settings = settings(
    max_examples=500, stateful_step_count=40, deadline=None
)
TestSupervisorAgainstModel = SupervisorMachine.TestCase
