"""Fault injection for running applications: kill actors on purpose and watch the tree recover.

Every function takes the running ``App`` and the path of an actor in it. Each injected fault is
recorded in ``app.events`` (kind ``fault_injected``) right beside the supervision steps it causes.

    await chaos.crash(app, "rl/rollouts/2")           # an exception inside the actor, now
    await chaos.stop(app, "rl/reward", "shutdown")    # it exits 'normal' / 'shutdown' / (...)
    await chaos.kill(app, "rl/learner")               # SIGKILL its process
    await chaos.kill(app, "rl/scoring")               # a supervisor: all under it at once
    await chaos.hang(app, "rl/rollouts/0")            # SIGSTOP it: heartbeats stop, it is replaced
    await chaos.partition(app, "rl/rollouts/1", 2.0)  # its messages are lost for 2 s
    await chaos.delay(app, "rl/learner", 0.05, 5.0)   # messages to it arrive 50 ms late for 5 s
    chaos.fail_starts(app, "rl/reward", 2)            # its next 2 starts fail
    await chaos.kill_controller(app)                  # SIGKILL this controller: a standby
                                                      # takes over (needs takeover=...)

Two ways to throw faults by the dozen, both reproducible from a seed:

- ``FaultPlan``: faults at *steps* of your own loop (iteration 3: kill the learner). The same plan
  injects the same faults at the same points on any machine, however fast it runs: use it in
  tests and examples whose assertions count faults and restarts. A plan can kill the
  controller too (``controller_kills=``, kind ``"controller"``) when the app runs with a
  takeover: the standby's driver, resuming at that step, finds the kill journalled and goes on.
- ``ChaosMonkey``: faults at random *times* in the background (a rate per second), for soak runs
  and for calls that must keep being answered whatever the timing.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import os
import random
import signal
import sys
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import NoReturn

import trio

from ._controller._app import App, context
from ._controller._placement import LocalPlacement
from ._controller._takeover import current_state, journal_mark, journal_marks
from ._controller._tree import TreeContext
from ._core._errors import TakeoverError
from ._core._exits import ActorCrash
from ._core._reasons import KILLED, NORMAL, SHUTDOWN
from ._core._spec import Mesh, Supervisor
from ._core._supevents import LogEntry, LogKind

log = logging.getLogger("otpmesh.chaos")

__all__ = [
    "FAULTS",
    "ChaosMonkey",
    "Fault",
    "FaultPlan",
    "PlannedFault",
    "crash",
    "delay",
    "drop",
    "fail_starts",
    "hang",
    "kill",
    "kill_controller",
    "partition",
    "stop",
    "wedge",
]

#: The faults a ChaosMonkey can throw, by name.
FAULTS = ("crash", "stop", "kill", "hang", "wedge", "partition", "delay", "drop", "fail_start")
#: The kind of a planned controller kill (``FaultPlan``), and the path its entries name.
CONTROLLER = "controller"


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault: when (trio time), what, where, and whether it hit a running actor."""

    time: float
    kind: str
    path: str
    detail: str = ""
    hit: bool = True

    def __str__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        if self.kind == CONTROLLER:
            return f"kill the controller{detail}"
        return f"{self.kind} {self.path}{detail}" + ("" if self.hit else " [missed: not running]")


def _tree(app: App, path: str) -> TreeContext:
    """The tree that has `path`: the app's own, or one that an actor of it owns."""
    return context(app).holder(path) or context(app)


def _record(app: App, kind: str, path: str, detail: str = "", hit: bool = True) -> Fault:
    fault = Fault(trio.current_time(), kind, path, detail, hit)
    sup, _, child = path.rpartition("/")
    app.events.append(LogEntry(fault.time, LogKind.FAULT_INJECTED, sup, child, None, str(fault)))
    return fault


async def _inject(app: App, kind: str, path: str, detail: str, fault: str, reason: object) -> Fault:
    """Log the fault, then cause it: its entry comes before the exit it causes."""
    recorded = _record(app, kind, path, detail)
    tree = _tree(app, path)
    if await tree.placement.inject(tree.slot(path), fault, reason):
        return recorded
    return _record(app, kind, path, detail, hit=False)


def _slot(app: App, path: str):  # type: ignore[no-untyped-def]
    app.actor(path)  # validates: a worker path of this tree
    return _tree(app, path).slot(path)


async def crash(app: App, path: str, reason: str = "chaos") -> Fault:
    """Crash the actor at once, as if an exception (``ChaosCrash``) were raised inside it."""
    _slot(app, path)
    return await _inject(app, "crash", path, reason, "crash", ActorCrash("ChaosCrash", reason))


async def stop(app: App, path: str, reason: object = NORMAL) -> Fault:
    """Make the actor exit with `reason` ('normal', 'shutdown', ('shutdown', detail), ...) after
    its current message, as if it had called ``self.stop(reason)``.

    At a supervisor's (or a mesh's) path it forces a stop on the supervisor, as its parent's
    terminate would but with `reason` (in OTP, what a supervisor does when its parent sends it
    an exit signal): it terminates its children in its shutdown order and exits with `reason`,
    and its parent applies its strategy (a permanent child supervisor is restarted, static
    children only). At the root it ends the app: with an abnormal reason ``otpmesh.start``
    raises ``SupervisorError``, with 'normal' or 'shutdown' the block just ends."""
    tree = _tree(app, path)
    if isinstance(tree.specs.get(path), Supervisor | Mesh):
        recorded = _record(app, "stop", path, repr(reason))
        if tree.exit_supervisor(path, reason):
            return recorded
        return _record(app, "stop", path, "not running", hit=False)
    _slot(app, path)
    return await _inject(app, "stop", path, repr(reason), "exit", reason)


async def kill(app: App, path: str) -> Fault:
    """SIGKILL the actor's worker process (in-process placement: kill the actor itself).

    At a supervisor's (or a mesh's) path it is OTP's ``exit(Sup, kill)``: every actor under
    it is killed at once (brutal: no orderly stop, no ``on_stop``), the supervisor exits with
    ``killed``, and its parent applies its strategy. At the root it ends the app with
    ``SupervisorError``."""
    tree = _tree(app, path)
    if isinstance(tree.specs.get(path), Supervisor | Mesh):
        recorded = _record(app, "kill", path, "the supervisor and everything under it")
        if await tree.kill_supervisor(path):
            return recorded
        return _record(app, "kill", path, "not running", hit=False)
    slot = _slot(app, path)
    proc = tree.placement.process(slot)
    if proc is None and isinstance(tree.placement, LocalPlacement):
        return await _inject(app, "kill", path, "in-process", "kill", KILLED)
    if proc is None:  # its process is gone already (it is restarting)
        return _record(app, "kill", path, "no process", hit=False)
    incarnation = proc.actors.get(path)
    fault = _record(app, "kill", path, f"SIGKILL pid {proc.pid}", hit=incarnation is not None)
    if incarnation is not None:
        tree.actor_exiting(path, incarnation)  # settled() now waits for this exit and its restart
    os.kill(proc.pid, signal.SIGKILL)
    return fault


async def hang(app: App, path: str) -> Fault:
    """SIGSTOP the actor's process: calls to it time out, its heartbeats stop, and the runtime
    kills and replaces it (``OTPMESH_HEARTBEAT_TIMEOUT``, 2 s by default)."""
    slot = _slot(app, path)
    proc = _tree(app, path).placement.process(slot)
    if proc is None:
        return _record(app, "hang", path, "needs placement='procs'", hit=False)
    os.kill(proc.pid, signal.SIGSTOP)
    return _record(app, "hang", path, f"SIGSTOP pid {proc.pid}")


async def wedge(app: App, path: str, seconds: float | None = None) -> Fault:
    """Wedge the actor's next endpoint call: it blocks its thread (in ``chaos_wedge``, which its
    stack shows) for `seconds`, or for ever, as a wedged engine does, while its process stays
    alive and beating. Only a progress deadline (``progress_deadline`` in its spec or endpoint)
    gets it out: use it to test yours. In ``placement="local"`` the controller itself blocks."""
    if seconds is not None and not (isinstance(seconds, int | float) and seconds > 0):
        raise ValueError(f"wedge seconds must be positive or None, not {seconds!r}")
    detail = "for ever" if seconds is None else f"for {seconds:g} s"
    return await _inject(app, "wedge", path, detail, "wedge", seconds)


async def partition(app: App, path: str, seconds: float) -> Fault:
    """Cut the actor's process off for `seconds`: every call, cast and reply it sends or receives
    is lost (calls to it time out: give them a timeout). Supervision's own messages and the
    heartbeats still flow, so the process is not replaced and its exits are not lost."""
    return await _link_fault(app, path, "partition", seconds, delay=0.0)


async def delay(app: App, path: str, latency: float, seconds: float) -> Fault:
    """For `seconds`, messages from the controller to the actor arrive `latency` s late."""
    return await _link_fault(app, path, "delay", seconds, delay=latency)


async def drop(app: App, path: str, seconds: float) -> Fault:
    """For `seconds`, messages from the controller to the actor are lost."""
    return await _link_fault(app, path, "drop", seconds, delay=math.inf)


async def _link_fault(app: App, path: str, kind: str, seconds: float, delay: float) -> Fault:
    slot = _slot(app, path)
    tree = _tree(app, path)
    node = tree.runtime_node
    if kind == "partition":
        proc = tree.placement.process(slot)
        if proc is None or proc.conn is None:
            return _record(app, kind, path, "needs placement='procs'", hit=False)
        node.sys_cast(proc.conn, "partition", {"seconds": seconds})
        return _record(app, kind, path, f"{seconds:g} s")
    if not slot.addr:
        return _record(app, kind, path, "not running", hit=False)
    node.faults.add(slot.addr, delay, seconds)
    detail = f"{seconds:g} s" if kind == "drop" else f"+{delay * 1e3:g} ms for {seconds:g} s"
    return _record(app, kind, path, detail)


def fail_starts(app: App, path: str, count: int = 1) -> Fault:
    """Make the next `count` starts of the actor at `path` fail (a ``ChaosStartFailure``)."""
    app.actor(path)
    _tree(app, path).fail_next_starts(path, count)
    return _record(app, "fail_start", path, f"next {count}")


def _takeover_of(app: App, what: str):  # type: ignore[no-untyped-def]
    """The app's takeover state; a TakeoverError that says how to get one if it has none."""
    context(app)  # validates: a running app
    state = current_state()
    if state is None:
        raise TakeoverError(
            f"{what} SIGKILLs this controller, and this app runs without a takeover: nothing "
            "would take the tree over (its workers exit with their controller). Start it with "
            "otpmesh.start(tree, takeover=otpmesh.Takeover(dir=...)) and run a standby beside "
            "it (docs/guides/takeover.md), or leave controller kills out of the plan"
        )
    return state


async def kill_controller(app: App, mark: Mapping[str, object] | None = None) -> NoReturn:
    """SIGKILL this controller (the process running `app`), as an OOM kill or a bug would: it
    does not return. The app must run with a takeover (``otpmesh.start(tree,
    takeover=Takeover(...))``), else ``TakeoverError``: its workers then wait out the grace
    period and a standby takes the tree over. The kill is journalled first (fsync'd, with
    `mark`), where a ``FaultPlan`` on the standby finds it."""
    state = _takeover_of(app, "chaos.kill_controller")
    fault = _record(app, CONTROLLER, CONTROLLER, f"SIGKILL pid {os.getpid()}")  # for the log
    log.warning("chaos: %s", fault)
    journal_mark(state, {"chaos": CONTROLLER, "pid": os.getpid(), **(mark or {})})
    sys.stdout.flush()  # what this controller printed is not lost with it
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    await trio.sleep_forever()  # not reached: SIGKILL is not deferred


# ---------------------------------------------------------------- monkeys and plans


def _check_kinds(kinds: Iterable[str]) -> None:
    unknown = set(kinds) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")


def _check_faults(faults: Mapping[str, float]) -> None:
    if CONTROLLER in faults:
        raise ValueError(
            "a controller kill is not drawn by weight: give FaultPlan.seeded(..., "
            "controller_kills=N) for N of them (a ChaosMonkey does not kill controllers)"
        )
    _check_kinds(faults)
    if not faults or not all(weight >= 0 for weight in faults.values()) or not any(faults.values()):
        raise ValueError(f"faults needs a positive weight for at least one kind, not {faults!r}")


def _target_paths(app: App, targets: Sequence[str]) -> list[str]:
    """The actor paths of `app`'s tree matching any glob in `targets`, in a fixed order."""
    workers = context(app).worker_paths()
    paths = [p for p in workers if any(fnmatch.fnmatchcase(p, g) for g in targets)]
    if not paths:
        raise ValueError(f"no actor of this tree matches targets {list(targets)}")
    return paths


async def _throw(app: App, kind: str, path: str, seconds: float, why: str) -> Fault:
    """Throw one fault of `kind` (a name in FAULTS) at `path`; `seconds` for the timed ones."""
    try:
        if kind == "crash":
            return await crash(app, path, why)
        if kind == "stop":
            return await stop(app, path, SHUTDOWN)
        if kind == "kill":
            return await kill(app, path)
        if kind == "hang":
            return await hang(app, path)
        if kind == "wedge":
            return await wedge(app, path, seconds)
        if kind == "partition":
            return await partition(app, path, seconds)
        if kind == "delay":
            return await delay(app, path, 0.05, seconds)
        if kind == "drop":
            return await drop(app, path, seconds)
        return fail_starts(app, path, 1)
    except (ProcessLookupError, KeyError) as exc:
        return _record(app, kind, path, str(exc), hit=False)


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """One entry of a ``FaultPlan``: at `step`, throw `kind` at the actor at `path`."""

    step: int
    kind: str
    path: str

    def __str__(self) -> str:
        if self.kind == CONTROLLER:
            return f"step {self.step}: kill the controller"
        return f"step {self.step}: {self.kind} {self.path}"


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Faults pinned to steps of the caller's own loop, not to the clock: call
    ``await plan.inject(app, step)`` at the top of step `step` and it throws exactly the faults
    planned for it. The same plan throws the same faults at the same points on any machine.

    ``FaultPlan.seeded(...)`` draws a plan from a seed; a plan can also be written by hand:
    ``FaultPlan([PlannedFault(3, "kill", "rl/learner")])``."""

    faults: Sequence[PlannedFault]
    partition_seconds: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", tuple(self.faults))
        _check_kinds(fault.kind for fault in self.faults if fault.kind != CONTROLLER)
        steps = [fault.step for fault in self.faults]
        if steps != sorted(steps) or any(step < 0 for step in steps):
            raise ValueError(f"a plan's steps must be >= 0 and in order, not {steps}")

    @classmethod
    def seeded(
        cls,
        app: App,
        *,
        seed: int,
        steps: int,
        count: int,
        targets: Sequence[str] = ("*",),
        faults: Mapping[str, float] | None = None,
        first: int = 1,
        controller_kills: int = 0,
    ) -> FaultPlan:
        """`count` faults at distinct steps drawn from ``range(first, steps)``, kinds drawn with
        the weights in `faults` (crash and kill by default), each aimed at an actor matching
        `targets`; then `controller_kills` SIGKILLs of the controller itself (kind
        ``"controller"``), at other steps drawn from the same range, which needs an app run
        with a takeover (else ``TakeoverError``). The same arguments against the same tree
        give the same plan (the actor faults the same with or without controller kills)."""
        weights = {"crash": 1.0, "kill": 1.0} if faults is None else dict(faults)
        _check_faults(weights)
        paths = _target_paths(app, targets)
        if controller_kills:
            _takeover_of(app, f"a plan with controller_kills={controller_kills}")
        if not 0 <= count + controller_kills <= max(0, steps - first):
            kills = f" and controller_kills={controller_kills}" if controller_kills else ""
            raise ValueError(
                f"count={count} faults{kills} do not fit at distinct steps in "
                f"range({first}, {steps})"
            )
        rng = random.Random(seed)
        kinds, kind_weights = zip(*sorted(weights.items()), strict=True)
        at = sorted(rng.sample(range(first, steps), count))
        planned = [
            PlannedFault(step, rng.choices(kinds, kind_weights)[0], rng.choice(paths))
            for step in at
        ]
        free = [step for step in range(first, steps) if step not in at]
        for step in rng.sample(free, controller_kills):
            planned.append(PlannedFault(step, CONTROLLER, CONTROLLER))
        return cls(tuple(sorted(planned, key=lambda fault: fault.step)))

    def at(self, step: int) -> list[PlannedFault]:
        """The faults planned for `step`, in plan order."""
        return [fault for fault in self.faults if fault.step == step]

    async def inject(self, app: App, step: int) -> list[Fault]:
        """Throw the faults planned for `step`, one after another, and return what was thrown.
        When there are any, it first waits for ``app.settled()``: the restarts an earlier fault
        caused are done, so each fault meets a running actor (and counts as one restart).

        A controller kill does not return (``kill_controller``). The standby that takes over
        runs its driver again, which resumes at this step and calls ``inject`` for it again:
        the faults up to the kill, which the journal holds, are not thrown twice; the kill's
        record is returned in their place and the step's later faults are thrown."""
        planned = self.at(step)
        if not planned:
            return []
        thrown: list[Fault] = []
        start = 0  # the first of this step's faults still to throw
        if any(fault.kind == CONTROLLER for fault in planned):
            state = _takeover_of(app, "a plan's controller kill")
            for mark in journal_marks(state, "chaos"):
                if mark.get("step") == step and mark.get("plan") == str(self):
                    start = int(str(mark["index"])) + 1
                    detail = f"SIGKILL pid {mark['pid']}, the controller this one took over from"
                    thrown = [_record(app, CONTROLLER, CONTROLLER, detail)]
        await app.settled()
        for index, fault in enumerate(planned[start:], start):
            if fault.kind == CONTROLLER:
                mark = {"step": step, "index": index, "plan": str(self)}
                await kill_controller(app, mark)
            else:
                why, seconds = f"planned, step {step}", self.partition_seconds
                thrown.append(await _throw(app, fault.kind, fault.path, seconds, why))
        return thrown

    def __len__(self) -> int:
        return len(self.faults)

    def __str__(self) -> str:
        return "; ".join(map(str, self.faults)) or "no faults"


# ---------------------------------------------------------------- the monkey


@dataclass
class ChaosMonkey:
    """Throws random faults at the actors matching `targets` (globs over paths), `rate` faults
    per second on average, kinds drawn with the weights in `faults`. The same `seed` gives the
    same schedule (times, kinds, target positions) against the same tree."""

    app: App
    seed: int = 0
    rate: float = 1.0
    targets: Sequence[str] = ("*",)
    faults: Mapping[str, float] = field(default_factory=lambda: {"crash": 1.0, "kill": 1.0})
    max_faults: int | None = None
    partition_seconds: float = 1.0
    injected: list[Fault] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check_faults(self.faults)
        if not self.rate > 0:
            raise ValueError(
                f"rate must be a positive number of faults per second, not {self.rate}"
            )
        self.paths()

    def paths(self) -> list[str]:
        """The actor paths the monkey aims at, in a fixed order."""
        return _target_paths(self.app, self.targets)

    def schedule(self, count: int) -> list[tuple[float, str, str]]:
        """The first `count` faults this seed throws: (seconds after the previous, kind, path)."""
        rng = random.Random(self.seed)
        kinds, weights = zip(*sorted(self.faults.items()), strict=True)
        paths = self.paths()
        return [
            (
                rng.expovariate(self.rate),
                rng.choices(kinds, weights)[0],
                paths[rng.randrange(len(paths))],
            )
            for _ in range(count)
        ]

    async def run(self) -> None:
        """Throw faults until cancelled (or `max_faults` were thrown)."""
        count = self.max_faults if self.max_faults is not None else 1 << 62
        rng = random.Random(self.seed)
        kinds, weights = zip(*sorted(self.faults.items()), strict=True)
        paths = self.paths()
        for _ in range(count):
            wait = rng.expovariate(self.rate)
            kind = rng.choices(kinds, weights)[0]
            path = paths[rng.randrange(len(paths))]
            await trio.sleep(wait)
            self.injected.append(
                await _throw(self.app, kind, path, self.partition_seconds, "chaos monkey")
            )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[ChaosMonkey]:
        """``async with monkey.running():`` throws faults for as long as the block runs."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.run)
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()
