"""A pure simulator: a whole tree of supervisor cores driven by a scripted fault schedule.

It plays the driver for every core of a tree, with idealised children: a start succeeds unless
``start_plans`` says otherwise, a stop request is obeyed at once, and no time passes unless a step
says so. Steps are applied one at a time, each after the tree has settled, which is how the Erlang
differential tests drive the real OTP supervisor, so the two produce comparable traces.

The trace is a list of tuples, the process-level facts an observer of the real system sees:

* ``("sup_start", path)``: a supervisor began its initial start;
* ``("start", path, outcome)``: a worker's start returned ``"ok"``, ``"ignore"`` or
  ``("error", reason)``;
* ``("exit", path, reason)``: a started worker or supervisor exited;
* ``("reply", sup_path, op, outcome)``: a dynamic-children request returned (``outcome`` is an
  :class:`Outcome` value, or ``("start_error", reason)``);
* ``("root_init_failed", reason)``: the root's initial start failed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from .._core._reasons import KILLED, SHUTDOWN
from .._core._spec import BRUTAL_KILL, ChildSpec, Mesh, Supervisor, Worker
from .._core._supervisor import SupervisorCore
from .._core._supevents import (
    ChildExited,
    ChildStarted,
    ChildTerminated,
    Command,
    DeleteChildRequest,
    Event,
    Exit,
    InitDone,
    InitFailed,
    LogEntry,
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

StartOutcome: TypeAlias = Literal["ok", "ignore"] | tuple[Literal["error"], object]
TraceEntry: TypeAlias = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Crash:
    """The running worker at `path` exits by itself with `reason` (skipped if not running)."""

    path: str
    reason: object = "crash"


@dataclass(frozen=True, slots=True)
class StopSupervisor:
    """The supervisor at `path` is stopped with `reason` (OTP's ``sys:terminate``)."""

    path: str
    reason: object = SHUTDOWN


@dataclass(frozen=True, slots=True)
class KillSupervisor:
    """The supervisor at `path` is killed (OTP's ``exit(Sup, kill)``, ``otpmesh.chaos.kill``):
    it and everything under it die at once with ``killed``; its parent sees the exit."""

    path: str


@dataclass(frozen=True, slots=True)
class Advance:
    """The clock moves on by `seconds`."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Call:
    """A dynamic-children request to the supervisor at `sup`: `op` is ``start_child`` (with
    `spec`) or ``terminate_child`` / ``restart_child`` / ``delete_child`` (with `id`)."""

    sup: str
    op: Literal["start_child", "terminate_child", "restart_child", "delete_child"]
    id: str = ""
    spec: ChildSpec | None = None


Step: TypeAlias = Crash | StopSupervisor | KillSupervisor | Advance | Call


@dataclass(slots=True)
class _Node:
    core: SupervisorCore
    parent: _Node | None
    id: str
    incarnation: int


@dataclass(slots=True)
class _Running:
    parent: _Node
    id: str
    incarnation: int


@dataclass
class Simulation:
    """Runs `tree` with idealised children; see the module docstring for the trace."""

    tree: Supervisor
    start_plans: Mapping[str, Sequence[StartOutcome]] = field(default_factory=dict)
    now: float = 0.0
    trace: list[TraceEntry] = field(default_factory=list)
    log: list[LogEntry] = field(default_factory=list)
    root_exit: object = None
    _nodes: dict[str, _Node] = field(default_factory=dict)
    _workers: dict[str, _Running] = field(default_factory=dict)
    _plans: dict[str, deque[StartOutcome]] = field(default_factory=dict)
    _calls: dict[object, tuple[str, str]] = field(default_factory=dict)
    _counters: dict[str, dict[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._plans = {path: deque(plan) for path, plan in self.start_plans.items()}

    @property
    def alive(self) -> bool:
        """True while the root supervisor runs."""
        return self.tree.id in self._nodes

    def running(self) -> set[str]:
        """The paths of every running worker and supervisor."""
        return set(self._nodes) | set(self._workers)

    def supervisors(self) -> list[str]:
        """The paths of every running supervisor."""
        return sorted(self._nodes)

    def core(self, path: str) -> SupervisorCore:
        """The core of the running supervisor at `path`."""
        return self._nodes[path].core

    def start(self) -> Simulation:
        """Start the tree (OTP's ``start_link`` of the root)."""
        root = _Node(SupervisorCore(self.tree), None, self.tree.id, 1)
        self._nodes[self.tree.id] = root
        self.trace.append(("sup_start", self.tree.id))
        result = self._pump(root, self._call(root, lambda: root.core.start(self.now)))
        if isinstance(result, InitFailed):
            del self._nodes[self.tree.id]
            self.root_exit = result.reason
            self.trace.append(("root_init_failed", result.reason))
        return self

    def run(self, steps: Iterable[Step], *, stop: bool = True) -> Simulation:
        """Apply `steps` in order while the root is alive; then stop the root if `stop`."""
        for step in steps:
            if not self.alive:
                break
            self.apply(step)
        if stop and self.alive:
            self.apply(StopSupervisor(self.tree.id, SHUTDOWN))
        return self

    def apply(self, step: Step) -> None:
        """Apply one step to the settled tree."""
        if isinstance(step, Advance):
            self.now += step.seconds
        elif isinstance(step, Crash):
            worker = self._workers.pop(step.path, None)
            if worker is not None:
                self.trace.append(("exit", step.path, step.reason))
                event = ChildExited(worker.id, worker.incarnation, step.reason)
                self._deliver(worker.parent, event)
        elif isinstance(step, StopSupervisor):
            node = self._nodes.get(step.path)
            if node is not None:
                self._deliver(node, Stop(step.reason))
        elif isinstance(step, KillSupervisor):
            node = self._nodes.get(step.path)
            if node is not None:
                self._kill_subtree(step.path)
                self._exited(node, KILLED, gone=True)
        else:
            node = self._nodes.get(step.sup)
            if node is not None:
                self._deliver(node, self._request(step))

    # ---- driving cores ----------------------------------------------------------------------

    def _request(self, call: Call) -> Event:
        ref = len(self._calls)
        self._calls[ref] = (call.sup, call.op)
        if call.op == "start_child":
            if call.spec is None:
                raise ValueError("Call('start_child') needs spec=")
            return StartChildRequest(ref, call.spec)
        if call.op == "terminate_child":
            return TerminateChildRequest(ref, call.id)
        if call.op == "restart_child":
            return RestartChildRequest(ref, call.id)
        return DeleteChildRequest(ref, call.id)

    def _call(self, node: _Node, feed: Callable[[], list[Command]]) -> list[Command]:
        commands = feed()
        self.log.extend(node.core.take_log())
        return commands

    def _handle(self, node: _Node, event: Event) -> list[Command]:
        return self._call(node, lambda: node.core.handle(event, self.now))

    def _deliver(self, node: _Node, event: Event) -> None:
        result = self._pump(node, self._handle(node, event))
        if isinstance(result, Exit):
            self._exited(node, result.reason)

    def _exited(self, node: _Node, reason: object, gone: bool = False) -> None:
        """A supervisor exited by itself: for its parent this is an ordinary child exit."""
        if not gone:
            del self._nodes[node.core.path]
        self.trace.append(("exit", node.core.path, reason))
        if node.parent is None:
            self.root_exit = reason
        else:
            self._deliver(node.parent, ChildExited(node.id, node.incarnation, reason))

    def _pump(self, node: _Node, commands: list[Command]) -> InitDone | InitFailed | Exit | None:
        """Carry out a core's commands until it waits for the outside world."""
        pending = deque(commands)
        result: InitDone | InitFailed | Exit | None = None
        while pending:
            command = pending.popleft()
            if isinstance(command, StartChild):
                pending.extend(self._handle(node, self._start_child(node, command)))
            elif isinstance(command, TerminateChild):
                pending.extend(self._handle(node, self._terminate_child(node, command)))
            elif isinstance(command, Reply):
                self._record_reply(command)
            else:
                result = command
        return result

    def _start_child(self, node: _Node, command: StartChild) -> Event:
        path = f"{node.core.path}/{command.id}"
        spec = command.spec
        if isinstance(spec, Worker):
            plan = self._plans.get(path)
            outcome: StartOutcome = plan.popleft() if plan else "ok"
            self.trace.append(("start", path, outcome))
            if outcome == "ok":
                self._workers[path] = _Running(node, command.id, command.incarnation)
                return ChildStarted(command.id)
            if outcome == "ignore":
                return StartIgnored(command.id)
            return StartFailed(command.id, outcome[1])
        group = spec.as_supervisor() if isinstance(spec, Mesh) else spec
        # Incarnation counters outlive a restarted supervisor, as the trio driver's do.
        core = SupervisorCore(group, path=path, incarnations=self._counters.setdefault(path, {}))
        child = _Node(core, node, command.id, command.incarnation)
        self._nodes[path] = child
        self.trace.append(("sup_start", path))
        result = self._pump(child, self._call(child, lambda: child.core.start(self.now)))
        if isinstance(result, InitFailed):
            del self._nodes[path]
            return StartFailed(command.id, result.reason)
        return ChildStarted(command.id)

    def _terminate_child(self, node: _Node, command: TerminateChild) -> Event:
        path = f"{node.core.path}/{command.id}"
        if command.shutdown is BRUTAL_KILL:
            reason: object = KILLED
            self._kill_subtree(path)
        elif path in self._workers:
            reason = SHUTDOWN
            del self._workers[path]
        else:
            child = self._nodes[path]
            result = self._pump(child, self._handle(child, Stop(SHUTDOWN)))
            reason = result.reason if isinstance(result, Exit) else SHUTDOWN
            del self._nodes[path]
        self.trace.append(("exit", path, reason))
        return ChildTerminated(command.id, command.incarnation, reason)

    def _kill_subtree(self, path: str) -> None:
        """Killing a supervisor kills its descendants concurrently (in no defined order)."""
        below = sorted(p for p in self.running() if p.startswith(path + "/"))
        for p in reversed(below):
            self._workers.pop(p, None)
            self._nodes.pop(p, None)
            self.trace.append(("exit", p, KILLED))
        self._workers.pop(path, None)
        self._nodes.pop(path, None)

    def _record_reply(self, reply: Reply) -> None:
        sup, op = self._calls[reply.ref]
        outcome: object = reply.outcome.value
        if reply.outcome is Outcome.START_ERROR:
            outcome = ("start_error", reply.reason)
        self.trace.append(("reply", sup, op, outcome))


def simulate(
    tree: Supervisor,
    steps: Iterable[Step] = (),
    *,
    start_plans: Mapping[str, Sequence[StartOutcome]] | None = None,
    stop: bool = True,
) -> Simulation:
    """Start `tree`, apply `steps`, stop it (unless `stop=False`); return the finished run."""
    sim = Simulation(tree, start_plans=dict(start_plans or {}))
    return sim.start().run(steps, stop=stop)
