"""``SupervisionMachine``: property-based fault testing of a real running tree, against the model.

Subclass it, set ``tree``, and hypothesis throws faults and calls at the running application while
checking, after every step, that it does what OTP's rules (``simulate``) say it must::

    class RolloutMachine(SupervisionMachine):
        tree = Supervisor("rl", children=[Mesh("rollouts", Rollout, shape={"gpus": 2})])
        call_endpoint = "ping"

    TestRollouts = RolloutMachine.TestCase

The app lives in a trio run of its own across hypothesis's rules: ``_appthread.py``; the faults
are ``_faults.py``'s.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeVar

import trio
from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from .._controller._app import App
from .._core._errors import ActorDiedError, ActorError, CallTimeoutError
from .._core._spec import Mesh, Supervisor, Worker
from .._core._supevents import LogEntry, LogKind
from ._appthread import AppThread, now
from ._checks import check_machine
from ._faults import CLEAR_ERRORS, FAULTS, HANG_FAULTS, model_reason, throw
from ._logkeys import first_difference, reason_key
from ._plugin import format_log
from ._simulate import Simulation, simulate
from ._steps import Advance, Crash, Step
from ._trees import owned_walk, per_tree

T = TypeVar("T")


# ---------------------------------------------------------------- the machine


def _from_machine(pick: Callable[[SupervisionMachine], Sequence[Any]]) -> st.SearchStrategy[Any]:
    """Draw from a sequence the running machine holds (its tree's paths, its faults)."""
    return st.runner().flatmap(lambda machine: st.sampled_from(pick(machine)))


_WORKER = _from_machine(lambda m: m._workers)
_FAULT = _from_machine(lambda m: m.faults)
_SECONDS = _from_machine(lambda m: m._advances)


class SupervisionMachine(RuleBasedStateMachine):
    """Faults and calls against a running ``tree``, checked after every step against the
    reference model. Subclass it and set ``tree``; ``TestCase`` is the pytest test.

    Invariants: the event log is the model's (kinds, paths, incarnations, reasons, and times under
    MockClock); every worker the model says runs answers ``call_endpoint`` (so every permanent
    child of a running supervisor is alive) and every other one fails fast with
    ``ActorDiedError``; every call ends with a result or a clear otpmesh error; after the example
    no worker process outlives the app. A failure prints the steps, the event log and the model's.

    One app per example: hypothesis creates a machine for each example, and ``__init__`` starts
    the tree (in a trio run of its own), then awaits ``setup_app(app)``; the rules and invariants
    follow. When the example ends (hypothesis's ``teardown``), ``teardown_app(app)`` is awaited,
    then the app is stopped and the model compared once more. Override the two hooks for
    per-example set-up and clean-up (both run in the app's trio run, time moving).
    """

    #: The tree under test (a Supervisor or a Mesh spec): set it in your subclass.
    tree: ClassVar[Supervisor | Mesh]
    #: Subtrees the tree's actors own: owner worker path -> the spec its actor starts with
    #: ``otpmesh.context().start(spec)`` in ``on_start`` (paths inside owned subtrees may own
    #: more). Their workers are fault and call targets too; the model checks them.
    owned: ClassVar[Mapping[str, Supervisor | Mesh]] = {}
    #: "local": in-process actors under MockClock (fast, exact). "procs": real worker processes.
    placement: ClassVar[Literal["local", "procs"]] = "local"
    #: An endpoint every worker of the tree has, taking no arguments (liveness checks, calls).
    call_endpoint: ClassVar[str] = "ping"
    #: The timeout of every call the machine makes, in seconds (virtual under MockClock).
    call_timeout: ClassVar[float] = 5.0
    #: How long a step may take to settle (trio time), and any step in wall-clock time.
    settle_timeout: ClassVar[float] = 30.0
    wall_timeout: ClassVar[float] = 60.0
    #: The faults to throw, a subset of ``FAULTS + HANG_FAULTS`` (the hangs, "wedge" and "hang",
    #: need placement="procs"; "wedge" needs a progress deadline on every worker).
    faults: ClassVar[Sequence[str]] = FAULTS
    #: Clock steps for the ``advance`` rule; None: under MockClock, around the tree's restart
    #: periods (so intensity windows open and close); over real processes, a moment (0.05 s).
    advances: ClassVar[Sequence[float] | None] = None
    #: A call that times out while its actor runs or restarts means a lost call: a failure,
    #: unless your endpoint may legitimately take longer than ``call_timeout``.
    allow_call_timeouts: ClassVar[bool] = False
    #: ``otpmesh.start(heartbeat_timeout=)`` (procs): how soon a SIGSTOPped worker ("hang") is
    #: found and killed. None: the default (``OTPMESH_HEARTBEAT_TIMEOUT``, else 2 s).
    heartbeat_timeout: ClassVar[float | None] = None

    def __init__(self) -> None:
        super().__init__()
        check_machine(type(self))
        self._workers: list[str] = [
            path for path, spec in owned_walk(self.tree, self.owned) if isinstance(spec, Worker)
        ]
        self._advances: list[float] = list(
            self.advances if self.advances is not None else self._periods()
        )
        self._model_tree = self.tree.as_supervisor() if isinstance(self.tree, Mesh) else self.tree
        self._steps: list[Step] = []  # the schedule as the model replays it
        self._journal: list[str] = []  # what the rules did, for the failure report
        self._runner = AppThread(
            self.tree, self.placement, self.wall_timeout, self.heartbeat_timeout
        )
        self._last = self._runner.run(now)  # the model's time 0
        try:
            if not self._runner.gone():
                self.run_in_app(self.setup_app)
        except BaseException:
            self._runner.close()  # hypothesis calls no teardown when __init__ fails
            raise

    async def setup_app(self, app: App) -> None:
        """Per-example set-up: override it. Awaited once per example, in the app's trio run,
        after the tree has started and before the first rule or invariant (the run then waits
        until the tree has settled). Call actors, load state, keep refs on ``self``; do not
        throw faults or change the tree here (the model does not see it). An exception fails
        the example, and the app is stopped."""

    async def teardown_app(self, app: App) -> None:
        """Per-example clean-up: override it. Awaited once per example after its last step,
        before the app is stopped (its root may have exited already: ``self.running()`` says
        what the model says runs). An exception fails the example, unless it already fails."""

    def _periods(self) -> list[float]:
        if self.placement != "local":
            return [0.05]  # real time: a moment (for calls and exits in flight), not a window
        specs = owned_walk(self.tree, self.owned)
        periods = {s.period for _, s in specs if isinstance(s, Supervisor | Mesh)}
        return sorted({p * k for p in periods for k in (0.5, 1.1)})

    @property
    def app(self) -> App:
        """The running application (for your own rules, inside ``run_in_app``)."""
        return self._runner.live

    def running(self) -> set[str]:
        """The paths the reference model says are running now (workers and supervisors): a
        precondition for your own rules, e.g. ``precondition(lambda m: "rl/x" in m.running())``.
        """
        return self._model().running()

    def run_in_app(self, fn: Callable[[App], Awaitable[T]]) -> T:
        """Run ``await fn(app)`` inside the app's trio run and wait until the tree has settled;
        return its result. Your own rules use this to call your actors."""

        async def step() -> T:
            with trio.fail_after(self.settle_timeout):
                result = await fn(self.app)
                await self._runner.settle()
            return result

        return self._runner.run(step)

    # ---------------------------------------------------------------- rules

    @rule(path=_WORKER, fault=_FAULT)
    def inject(self, path: str, fault: str) -> None:
        """Throw `fault` at the worker at `path`; wait until the tree has handled it."""
        expect_exit = path in self._model().running()
        self._log(self._runner.run(lambda: self._inject(path, fault, expect_exit)))

    @rule(path=_WORKER)
    def call(self, path: str) -> None:
        """Call `path`: a result if the model says it runs, ActorDiedError if not."""
        self._log(self._runner.run(lambda: self._call_as_expected([path])))

    @rule(path=_WORKER, fault=_FAULT, callee=_WORKER)
    def call_during_fault(self, path: str, fault: str, callee: str) -> None:
        """Call `callee` while `fault` hits `path`: the call must end, with a result or a clear
        error (a call that reached an actor that died says so; one that did not is retried)."""
        expect_exit = path in self._model().running()
        self._log(
            self._runner.run(lambda: self._fault_during_call(path, fault, expect_exit, callee))
        )

    @precondition(lambda self: bool(self._advances))
    @rule(seconds=_SECONDS)
    def advance(self, seconds: float) -> None:
        """Let time pass (restart intensity windows close)."""
        self._log(self._runner.run(lambda: self._advance(seconds)))

    # ---------------------------------------------------------------- invariants

    @invariant()
    def event_log_matches_model(self) -> None:
        self._compare(self._model(), "after the steps above")

    @invariant()
    def which_children_matches_model(self) -> None:
        """Every running supervisor's ``which_children`` is the model's: ids in order, status
        and incarnation."""
        if self._runner.gone():
            return
        model = self._model()
        for path in model.supervisors():
            expected = [(c.id, c.status, c.incarnation) for c in model.core(path).which_children()]
            real = [(c.id, c.status, c.incarnation) for c in self.app.which_children(path)]
            assert real == expected, f"which_children({path!r}): {real}, the model: {expected}"

    @invariant()
    def running_workers_answer(self) -> None:
        self._log(self._runner.run(lambda: self._call_as_expected(self._workers)))

    def teardown(self) -> None:
        failing = sys.exc_info()[1] is not None  # already failing: don't mask it
        try:
            try:
                if self._runner.app is not None:
                    self.run_in_app(self.teardown_app)
            finally:
                self._runner.close()
        except Exception:
            if not failing:
                raise
        if failing:
            return
        self._steps.append(Advance(self._runner.stop_time - self._last))
        model = simulate(self._model_tree, self._steps, owned=self.owned)
        self._compare(model, "after the app stopped")
        living = self._runner.orphans()
        if living:
            raise AssertionError(f"worker processes outlived the app: {living}\n" + self.report())

    # ---------------------------------------------------------------- trio side

    async def _inject(self, path: str, fault: str, expect_exit: bool) -> str:
        if self._runner.gone() or self._runner.holder(path) is None:
            return f"{fault} {path}: skipped, the app (or the subtree that had it) has ended"
        self._mark_time()
        with trio.fail_after(self.settle_timeout):
            incarnation = self._runner.incarnation(path)
            logged = len(self.app.events._entries)
            done = await throw(self.app, self._runner, path, fault, self._call)
            self._steps.append(Crash(path, self._model_reason(fault)))
            if expect_exit and incarnation is not None:
                await self._runner.exit_of(path, incarnation, logged)
            await self._runner.settle()
        return str(done)

    def _model_reason(self, fault: str) -> object:
        return model_reason(fault, self.placement, self.call_endpoint)

    async def _fault_during_call(
        self, path: str, fault: str, expect_exit: bool, callee: str
    ) -> str:
        outcome: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._call_and_record, callee, outcome)
            injected = await self._inject(path, fault, expect_exit)
        return f"{injected}; meanwhile {callee}.{self.call_endpoint}() -> {outcome[0]}"

    async def _call_and_record(self, path: str, outcome: list[str]) -> None:
        try:
            outcome.append(repr(await self._call(path)))
        except CallTimeoutError as exc:
            if not self.allow_call_timeouts:
                raise AssertionError(
                    f"a call to {path} made while a fault hit the tree never ended ({exc}): "
                    "a lost call (set allow_call_timeouts if it may legitimately be that slow)"
                ) from exc
            outcome.append(f"{type(exc).__name__}: {exc}")
        except CLEAR_ERRORS as exc:
            outcome.append(f"{type(exc).__name__}: {exc}")

    async def _call(self, path: str) -> object:
        if self._runner.holder(path) is None:  # an owned path whose owner runs no subtree now
            raise ActorDiedError(path, "no running subtree has it", delivered=False)
        endpoint = self.app.actor(path).endpoint(self.call_endpoint)
        return await endpoint.with_timeout(self.call_timeout)()

    async def _call_as_expected(self, paths: Sequence[str]) -> str:
        """Every worker the model says runs answers; every other one is reported dead at once."""
        running = self._model().running()
        seen = []
        for path in paths:
            alive = path in running and not self._runner.gone()
            try:
                value = await self._call(path)
            except ActorError:
                value = "ActorError"  # an answer all the same: the actor is alive
            except ActorDiedError as exc:
                if alive:
                    raise AssertionError(
                        f"{path} should be running (the model says so) but a call says: {exc}"
                    ) from exc
                seen.append(f"{path}: dead")
                continue
            except CallTimeoutError as exc:
                state = "run" if alive else "be reported dead"
                raise AssertionError(
                    f"a call to {path}, which should {state}, timed out (it hangs): {exc}"
                ) from exc
            if not alive:
                raise AssertionError(
                    f"{path} answered {value!r}, but the model says it is not running"
                )
            seen.append(f"{path}: {value!r}")
        self._runner.record_pids(self._workers)
        return "calls: " + ", ".join(seen)

    async def _advance(self, seconds: float) -> str:
        await trio.sleep(seconds)
        await self._runner.settle()
        return f"advanced {seconds:g} s"

    def _mark_time(self) -> None:
        """The model's clock follows the app's: the time since the previous step, as a step."""
        now = trio.current_time()
        if now > self._last:
            self._steps.append(Advance(now - self._last))
            self._last = now

    # ---------------------------------------------------------------- checks and reports

    def _model(self) -> Simulation:
        return simulate(self._model_tree, self._steps, owned=self.owned, stop=False)

    def _log(self, line: str) -> None:
        self._journal.append(line)
        note(line)
        if self._runner.gone():  # for --hypothesis-show-statistics: how often the tree gives up
            event("the root supervisor exited")

    def _compare(self, model: Simulation, when: str) -> None:
        """The real log and the model's agree tree by tree (``_logkeys.py`` says why)."""
        real = [
            e for e in self.app.events if e.kind not in (LogKind.FAULT_INJECTED, LogKind.TAKEOVER)
        ]
        times = self.placement == "local"
        found = first_difference(real, model.log, self.owned, self._parallel_paths(), times)
        if found is None:
            return
        tree, at = found
        which = f" of the log of the subtree {tree} owns (below)" if tree else ""
        real_t, model_t = per_tree(real, self.owned), per_tree(model.log, self.owned)
        raise AssertionError(
            f"the event log differs from the reference model {when}, at entry {at}{which}\n"
            + self.report(real_t.get(tree, []), model_t.get(tree, []), at)
        )

    def _parallel_paths(self) -> frozenset[str]:
        """The supervisors (meshes) that terminate their children all at once."""
        return frozenset(
            path
            for path, spec in owned_walk(self.tree, self.owned)
            if isinstance(spec, Mesh) or (isinstance(spec, Supervisor) and spec.parallel_shutdown)
        )

    def report(
        self,
        real: Sequence[LogEntry] | None = None,
        model: Sequence[LogEntry] | None = None,
        mark: int | None = None,
    ) -> str:
        """The fault schedule, what each step saw, the event log and the model's."""
        real = list(self.app.events) if real is None else real
        model = self._model().log if model is None else model
        steps = "\n".join(f"   {s!r}" for s in self._steps) or "   (none)"
        journal = "\n".join(f"   {line}" for line in self._journal) or "   (none)"
        return (
            f"tree: {self.tree!r}\nfault schedule (as replayed on the model):\n{steps}\n"
            f"steps:\n{journal}\nevent log ({self.placement}):\n{format_log(real, mark)}\n"
            f"model's event log:\n{format_log(model, mark)}"
        )


__all__ = [
    "CLEAR_ERRORS",
    "FAULTS",
    "HANG_FAULTS",
    "SupervisionMachine",
    "format_log",
    "reason_key",
]
