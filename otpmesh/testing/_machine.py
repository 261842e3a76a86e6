"""``SupervisionMachine``: property-based fault testing of a real running tree, against the model.

Subclass it, set ``tree``, and hypothesis throws faults and calls at the running application while
checking, after every step, that it does what OTP's rules (``simulate``) say it must::

    class RolloutMachine(SupervisionMachine):
        tree = Supervisor("rl", children=[Mesh("rollouts", Rollout, shape={"gpus": 2})])
        call_endpoint = "ping"

    TestRollouts = RolloutMachine.TestCase

Design: hypothesis runs rules synchronously, but the application is a trio program that must live
across rules. So each example gets one trio run in a thread of its own, hosting the app for the
whole example; every rule sends one task into that run and waits for it (``_AppThread.run``), with
a wall-clock limit so that a wedged run fails the test instead of hanging it. Time: in-process
trees (``placement="local"``) run under ``trio.testing.MockClock``, which is driven from the trio
thread only: frozen (no autojump) while hypothesis thinks between rules, autojumping while a rule
runs, so timeouts and ``advance`` cost no wall-clock time and the event log's times are exact.
Trees over real processes (``placement="procs"``) use the real clock.
"""

from __future__ import annotations

import concurrent.futures
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Literal, TypeVar

import trio
import trio.testing
from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from .. import chaos
from .._controller._app import App, context, start
from .._core._actor import Actor
from .._core._errors import ActorDiedError, ActorError, CallTimeoutError, SupervisorError
from .._core._exits import ActorCrash, ProcessExit
from .._core._reasons import KILLED
from .._core._spec import Mesh, Supervisor, Worker, walk
from .._core._supevents import LogEntry, LogKind
from ._plugin import format_log
from ._simulate import Advance, Crash, Simulation, Step, simulate

T = TypeVar("T")

#: The faults the machine throws: an exception inside the actor, a clean exit with 'normal' or
#: 'shutdown', and a kill (SIGKILL of its process under placement="procs").
FAULTS: tuple[str, ...] = ("crash", "stop_normal", "stop_shutdown", "kill")

#: The errors a call may end with; anything else escaping a call fails the test.
CLEAR_ERRORS = (ActorError, ActorDiedError, CallTimeoutError, SupervisorError)

_EXITS = (LogKind.CHILD_EXITED, LogKind.CHILD_TERMINATED)


def worker_paths(tree: Supervisor | Mesh) -> list[str]:
    """Every worker path of `tree` (mesh slots included), in start order."""
    return [path for path, spec in walk(tree) if isinstance(spec, Worker)]


def reason_key(reason: object) -> object:
    """A reason as the machine compares it: crashes by type and message, process deaths by kind
    only (the pid and the wording of the death differ from run to run)."""
    if isinstance(reason, ActorCrash):
        return ("ActorCrash", reason.type_name, reason.message)
    if isinstance(reason, ProcessExit):
        return ("ProcessExit",)
    if isinstance(reason, tuple | list):
        return tuple(reason_key(r) for r in reason)
    return reason


def entry_key(entry: LogEntry, t0: float, times: bool) -> tuple[object, ...]:
    """What must agree between the real log and the model's, entry by entry."""
    at = round(entry.time - t0, 6) if times else None
    return (
        at,
        str(entry.kind),
        entry.path,
        entry.child,
        entry.incarnation,
        reason_key(entry.reason),
    )


_BATCHED = (str(LogKind.CHILD_TERMINATED), str(LogKind.SHUTDOWN_ERROR))


def in_batches(keys: list[tuple[object, ...]], parallel: frozenset[str]) -> list[object]:
    """`keys` (``entry_key``s, in log order) with each run of terminations by one parallel
    shutdown supervisor (a mesh stops its members at once) in a fixed order: they end in
    whatever order the members happen to stop, the model's in the order it asked."""
    out: list[object] = []
    i = 0
    while i < len(keys):
        j = i
        while j < len(keys) and keys[j][1] in _BATCHED and keys[j][2] in parallel:
            if keys[j][2] != keys[i][2]:
                break
            j += 1
        if j - i > 1:
            out.extend(sorted(keys[i:j], key=repr))
            i = j
        else:
            out.append(keys[i])
            i += 1
    return out


# ---------------------------------------------------------------- the trio run, in a thread


class _AppThread:
    """One trio run in a thread of its own, hosting ``otpmesh.start(tree)`` until ``close()``;
    ``run(fn)`` runs ``await fn()`` as a task of that run and returns its result here."""

    def __init__(
        self,
        tree: Supervisor | Mesh,
        placement: Literal["local", "procs"],
        wall_timeout: float,
    ) -> None:
        self.tree = tree
        self.placement = placement
        self.wall_timeout = wall_timeout
        # Frozen until a rule runs (see the module docstring); None: the real clock.
        self.clock = (
            trio.testing.MockClock(autojump_threshold=math.inf) if placement == "local" else None
        )
        self.app: App | None = None
        self.failure: SupervisorError | None = None  # the root gave up (or failed to start)
        self.crashed: BaseException | None = None  # the trio run itself raised
        self.stop_time = 0.0
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self.ended: trio.Event | None = None
        self._thread = threading.Thread(
            target=self._thread_main, name=f"otpmesh-machine-{tree.id}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(wall_timeout):
            raise AssertionError(f"the app did not start within {wall_timeout:g} s")
        if self.crashed is not None:
            raise RuntimeError("the app's trio run failed while starting") from self.crashed

    def _thread_main(self) -> None:
        try:
            trio.run(self._main, clock=self.clock)
        except BaseException as exc:  # reported to the hypothesis thread by run() and close()
            self.crashed = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop, self.ended = trio.Event(), trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._host)
            await self._stop.wait()  # rules' tasks may still be sent after the app ended

    async def _host(self) -> None:
        assert self._stop is not None and self.ended is not None
        self._autojump(True)  # starting takes no time, but stop timeouts may need to fire
        try:
            async with start(self.tree, placement=self.placement) as app:
                self.app = app
                self._autojump(False)
                self._ready.set()
                await self._stop.wait()
        except SupervisorError as exc:
            self.failure = exc  # the root gave up: the model predicts it, the machine compares
        finally:
            self.ended.set()
            self._ready.set()

    def _autojump(self, on: bool) -> None:
        if self.clock is not None:
            self.clock.autojump_threshold = 0 if on else math.inf

    def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` in the app's trio run (time moving), its result or exception here."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        async def task() -> None:
            self._autojump(True)
            try:
                future.set_result(await fn())
            except BaseException as exc:
                future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise  # Cancelled and friends belong to trio
            finally:
                self._autojump(False)

        if self._token is None or self._nursery is None or self.crashed is not None:
            raise RuntimeError("the app's trio run has ended") from self.crashed
        try:
            self._token.run_sync_soon(self._nursery.start_soon, task)
        except trio.RunFinishedError:
            raise RuntimeError("the app's trio run has ended") from self.crashed
        try:
            return future.result(self.wall_timeout)
        except concurrent.futures.TimeoutError:
            raise AssertionError(
                f"a step did not finish within {self.wall_timeout:g} s of wall-clock time: "
                "something in the app's trio run blocks without yielding"
            ) from None

    def close(self) -> None:
        """Stop the app (children in reverse start order) and end the run."""

        def begin_stop() -> None:
            assert self._stop is not None
            self.stop_time = trio.current_time()
            self._autojump(True)
            self._stop.set()

        if self._token is not None and self._thread.is_alive():
            try:
                self._token.run_sync_soon(begin_stop)
            except trio.RunFinishedError:
                pass
        self._thread.join(self.wall_timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the app did not stop within {self.wall_timeout:g} s")
        if self.crashed is not None:
            raise RuntimeError("the app's trio run failed") from self.crashed


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
    """

    #: The tree under test (a Supervisor or a Mesh spec): set it in your subclass.
    tree: ClassVar[Supervisor | Mesh]
    #: "local": in-process actors under MockClock (fast, exact). "procs": real worker processes.
    placement: ClassVar[Literal["local", "procs"]] = "local"
    #: An endpoint every worker of the tree has, taking no arguments (liveness checks, calls).
    call_endpoint: ClassVar[str] = "ping"
    #: The timeout of every call the machine makes, in seconds (virtual under MockClock).
    call_timeout: ClassVar[float] = 5.0
    #: How long a step may take to settle (trio time), and any step in wall-clock time.
    settle_timeout: ClassVar[float] = 30.0
    wall_timeout: ClassVar[float] = 60.0
    #: The faults to throw, a subset of ``FAULTS``.
    faults: ClassVar[Sequence[str]] = FAULTS
    #: Clock steps for the ``advance`` rule; None: under MockClock, around the tree's restart
    #: periods (so intensity windows open and close); over real processes, a moment (0.05 s).
    advances: ClassVar[Sequence[float] | None] = None
    #: A call that times out while its actor runs or restarts means a lost call: a failure,
    #: unless your endpoint may legitimately take longer than ``call_timeout``.
    allow_call_timeouts: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self._check_class()
        self._workers: list[str] = worker_paths(self.tree)
        self._advances: list[float] = list(
            self.advances if self.advances is not None else self._periods()
        )
        self._model_tree = self.tree.as_supervisor() if isinstance(self.tree, Mesh) else self.tree
        self._steps: list[Step] = []  # the schedule as the model replays it
        self._journal: list[str] = []  # what the rules did, for the failure report
        self._pids: dict[int, str] = {}  # worker processes seen: pid -> its start time
        self._runner = _AppThread(self.tree, self.placement, self.wall_timeout)
        self._last = self._runner.run(_now)  # the model's time 0

    @classmethod
    def _check_class(cls) -> None:
        tree = getattr(cls, "tree", None)
        if not isinstance(tree, Supervisor | Mesh):
            raise TypeError(
                f"{cls.__name__}.tree must be a Supervisor or Mesh spec, not {tree!r}: write "
                "'tree = Supervisor(\"app\", children=[...])' in the class body"
            )
        if cls.placement not in ("local", "procs"):
            raise ValueError(
                f"{cls.__name__}.placement must be 'local' or 'procs', not {cls.placement!r}"
            )
        unknown = set(cls.faults) - set(FAULTS)
        if unknown or not cls.faults:
            raise ValueError(
                f"{cls.__name__}.faults={list(cls.faults)!r}: use a non-empty subset of {FAULTS}"
            )
        for path, spec in walk(tree):
            actor = spec.actor if isinstance(spec, Worker) else None
            if not (isinstance(actor, type) and issubclass(actor, Actor)):
                continue  # an import path: the controller need not import it, nor can we check
            if cls.call_endpoint not in actor.endpoints():
                raise ValueError(
                    f"{cls.__name__}.call_endpoint={cls.call_endpoint!r}, but the actor of "
                    f"{path} ({actor.__name__}) has no such endpoint; name one of "
                    f"{sorted(actor.endpoints())} that takes no arguments"
                )

    def _periods(self) -> list[float]:
        if self.placement != "local":
            return [0.05]  # real time: a moment (for calls and exits in flight), not a window
        periods = {s.period for _, s in walk(self.tree) if isinstance(s, Supervisor | Mesh)}
        return sorted({p * k for p in periods for k in (0.5, 1.1)})

    @property
    def app(self) -> App:
        """The running application (for your own rules, inside ``run_in_app``)."""
        if self._runner.app is None:
            raise RuntimeError("the app failed to start") from self._runner.failure
        return self._runner.app

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
                await self._settle()
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
        if self._ended():
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
            self._runner.close()
        except Exception:
            if not failing:
                raise
        if failing:
            return
        self._steps.append(Advance(self._runner.stop_time - self._last))
        self._compare(simulate(self._model_tree, self._steps), "after the app stopped")
        self._check_no_orphans()

    # ---------------------------------------------------------------- trio side

    async def _inject(self, path: str, fault: str, expect_exit: bool) -> str:
        if self._ended():
            return f"{fault} {path}: skipped, the app has ended"
        self._mark_time()
        with trio.fail_after(self.settle_timeout):
            incarnation = self._incarnation(path)
            done = await self._throw(path, fault)
            self._steps.append(Crash(path, self._model_reason(fault)))
            if expect_exit and incarnation is not None:
                await self._exit_of(path, incarnation)
            await self._settle()
        return str(done)

    async def _throw(self, path: str, fault: str) -> chaos.Fault:
        if fault == "crash":
            return await chaos.crash(self.app, path, "chaos")
        if fault.startswith("stop_"):
            return await chaos.stop(self.app, path, fault.removeprefix("stop_"))
        tree = context(self.app)
        proc = tree.placement.process(tree.slot(path))
        done = await chaos.kill(self.app, path)
        if proc is not None:
            # The process may host no actor (its child exited and was not restarted): then no
            # exit shows in the log, but the next step must not find it half dead.
            await proc.exited.wait()
        return done

    def _model_reason(self, fault: str) -> object:
        if fault == "crash":
            return ActorCrash("ChaosCrash", "chaos")
        if fault.startswith("stop_"):
            return fault.removeprefix("stop_")
        return ProcessExit(0, "killed by signal 9") if self.placement == "procs" else KILLED

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
        endpoint = self.app.actor(path).endpoint(self.call_endpoint)
        return await endpoint.with_timeout(self.call_timeout)()

    async def _call_as_expected(self, paths: Sequence[str]) -> str:
        """Every worker the model says runs answers; every other one is reported dead at once."""
        running = self._model().running()
        seen = []
        for path in paths:
            alive = path in running and not self._ended()
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
        self._record_pids()
        return "calls: " + ", ".join(seen)

    async def _advance(self, seconds: float) -> str:
        await trio.sleep(seconds)
        await self._settle()
        return f"advanced {seconds:g} s"

    async def _exit_of(self, path: str, incarnation: int) -> None:
        """Wait until the log shows this incarnation's exit (a SIGKILL is noticed some time
        after ``chaos.kill`` returns, and ``settled()`` cannot know one is coming)."""
        sup, _, child = path.rpartition("/")

        def seen(e: LogEntry) -> bool:
            return e.kind in _EXITS and (e.path, e.child, e.incarnation) == (
                sup,
                child,
                incarnation,
            )

        # No checkpoint between the look and the subscription: no entry can slip in between.
        if any(seen(e) for e in self.app.events) or self._ended():
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._cancel_when_ended, nursery.cancel_scope)
            entries = self.app.events.subscribe()
            try:
                async for entry in entries:
                    if seen(entry):
                        break
            finally:
                await entries.aclose()  # type: ignore[attr-defined]  # an async generator
            nursery.cancel_scope.cancel()

    async def _settle(self) -> None:
        """Wait until the tree has no work pending, or the app has ended (the root gave up)."""
        assert self._runner.ended is not None
        if not self._runner.ended.is_set():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._cancel_when_ended, nursery.cancel_scope)
                await self.app.settled()
                nursery.cancel_scope.cancel()
        if self._ended():
            # The root gave up: let the app finish stopping (its processes too), so the next
            # step finds it fully stopped rather than halfway.
            await self._runner.ended.wait()

    async def _cancel_when_ended(self, scope: trio.CancelScope) -> None:
        assert self._runner.ended is not None
        await self._runner.ended.wait()
        scope.cancel()

    def _ended(self) -> bool:
        """True once the root supervisor has exited (gave up, or failed to start)."""
        app = self._runner.app
        return (self._runner.ended is not None and self._runner.ended.is_set()) or (
            app is not None and context(app).root.exited.is_set()
        )

    def _mark_time(self) -> None:
        """The model's clock follows the app's: the time since the previous step, as a step."""
        now = trio.current_time()
        if now > self._last:
            self._steps.append(Advance(now - self._last))
            self._last = now

    def _incarnation(self, path: str) -> int | None:
        sup, _, child = path.rpartition("/")
        for e in reversed(self.app.events._entries):
            if e.kind == LogKind.CHILD_STARTED and (e.path, e.child) == (sup, child):
                return e.incarnation
        return None

    def _record_pids(self) -> None:
        if self.placement != "procs" or self._runner.app is None:
            return
        tree = context(self.app)
        for path in self._workers:
            proc = tree.placement.process(tree.slot(path))
            if proc is not None and proc.pid:
                self._pids.setdefault(proc.pid, _start_time(proc.pid))

    # ---------------------------------------------------------------- checks and reports

    def _model(self) -> Simulation:
        return simulate(self._model_tree, self._steps, stop=False)

    def _log(self, line: str) -> None:
        self._journal.append(line)
        note(line)
        if self._ended():  # for --hypothesis-show-statistics: how often the tree gives up
            event("the root supervisor exited")

    def _compare(self, model: Simulation, when: str) -> None:
        real = [e for e in self.app.events if e.kind != LogKind.FAULT_INJECTED]
        times = self.placement == "local"
        t_real, t_model = (real[0].time if real else 0.0), 0.0
        parallel = self._parallel_paths()
        got = in_batches([entry_key(e, t_real, times) for e in real], parallel)
        want = in_batches([entry_key(e, t_model, times) for e in model.log], parallel)
        if got == want:
            return
        at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        at = min(len(got), len(want)) if at is None else at
        raise AssertionError(
            f"the event log differs from the reference model {when}, at entry {at}\n"
            + self.report(real, model.log, at)
        )

    def _parallel_paths(self) -> frozenset[str]:
        """The supervisors (meshes) that terminate their children all at once."""
        return frozenset(
            path
            for path, spec in walk(self.tree)
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

    def _check_no_orphans(self) -> None:
        """No worker process of this app outlives it (the fork server reaps or kills them all)."""
        deadline = time.monotonic() + 5.0
        while True:
            alive = [pid for pid, t in self._pids.items() if _alive(pid, t)]
            if not alive:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"worker processes outlived the app: {alive}\n" + self.report()
                )
            time.sleep(0.05)


async def _now() -> float:
    return trio.current_time()


def _start_time(pid: int) -> str:
    """A process's start time (field 22 of /proc/PID/stat): tells a pid from its reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return ""


def _alive(pid: int, start_time: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == start_time


__all__ = ["CLEAR_ERRORS", "FAULTS", "SupervisionMachine", "format_log", "reason_key"]
