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

It journals each supervisor's child list as the trio driver does for a takeover
(``journal``: the records of _core/_livetree.py, specs kept as they are), and a ``Takeover``
step resumes the tree from that journal alone: no trace entry but the lost workers' exits, so
a run with takeovers must trace as the same run without them, where OTP sees only those exits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .._core._livetree import LiveTree, change_record
from .._core._reasons import KILLED, SHUTDOWN
from .._core._spec import BRUTAL_KILL, Mesh, Supervisor, Worker
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
from ._simnodes import Running, SimNode
from ._simowned import SimOwned
from ._simtakeover import SimTakeover
from ._steps import (
    Advance,
    Call,
    Crash,
    KillSupervisor,
    ModelStep,
    StartOutcome,
    StopSupervisor,
    Takeover,
    TraceEntry,
)
from ._trees import Owned, check_owned, tree_of


@dataclass
class Simulation(SimTakeover, SimOwned):
    """Runs `tree` with idealised children; see the module docstring for the trace."""

    tree: Supervisor
    start_plans: Mapping[str, Sequence[StartOutcome]] = field(default_factory=dict)
    #: Owner worker path -> the spec its actor starts in on_start (``context().start``).
    owned: Owned = field(default_factory=dict)
    now: float = 0.0
    trace: list[TraceEntry] = field(default_factory=list)
    log: list[LogEntry] = field(default_factory=list)
    root_exit: object = None
    _nodes: dict[str, SimNode] = field(default_factory=dict)
    _workers: dict[str, Running] = field(default_factory=dict)
    _plans: dict[str, deque[StartOutcome]] = field(default_factory=dict)
    _calls: dict[object, tuple[str, str]] = field(default_factory=dict)
    _counters: dict[str, dict[str, int]] = field(default_factory=dict)
    _subtrees: dict[str, SimNode] = field(default_factory=dict)  # owner path -> subtree root
    _specs: dict[str, Supervisor | Mesh] = field(default_factory=dict)  # supervisors' specs
    #: The takeover journal's child-list records, oldest first (since the last takeover).
    journal: list[dict[str, object]] = field(default_factory=list)
    _live: LiveTree | None = None  # during a takeover: the journal folded
    _lost: dict[str, Running] = field(default_factory=dict)  # during one: died in the gap
    _carried: dict[str, tuple[float, ...]] = field(default_factory=dict)  # and restart times
    _started: dict[str, int] = field(default_factory=dict)  # the journal's actor records

    def __post_init__(self) -> None:
        check_owned(self.tree, self.owned)
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
        root = SimNode(SupervisorCore(self.tree), None, self.tree.id, 1)
        self._nodes[self.tree.id] = root
        self.trace.append(("sup_start", self.tree.id))
        result = self._pump(root, self._call(root, lambda: root.core.start(self.now)))
        if isinstance(result, InitFailed):
            del self._nodes[self.tree.id]
            self.root_exit = result.reason
            self.trace.append(("root_init_failed", result.reason))
        return self

    def run(self, steps: Iterable[ModelStep], *, stop: bool = True) -> Simulation:
        """Apply `steps` in order while the root is alive; then stop the root if `stop`."""
        for step in steps:
            if not self.alive:
                break
            self.apply(step)
        if stop and self.alive:
            self.apply(StopSupervisor(self.tree.id, SHUTDOWN))
        return self

    def apply(self, step: ModelStep) -> None:
        """Apply one step to the settled tree."""
        if isinstance(step, Takeover):
            self._takeover(step)
        elif isinstance(step, Advance):
            self.now += step.seconds
        elif isinstance(step, Crash):
            self._crash(step.path, step.reason)
        elif isinstance(step, StopSupervisor):
            node = self._nodes.get(step.path)
            if node is not None:
                if node.owner is not None:  # the owner stops it (Subtree.stop()): no crash
                    self._subtrees.pop(node.owner, None)
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

    def _crash(self, path: str, reason: object) -> None:
        worker = self._workers.pop(path, None)
        if worker is not None:
            self.trace.append(("exit", path, reason))
            self._stop_owned(path)
            self._deliver(worker.parent, ChildExited(worker.id, worker.incarnation, reason))

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

    def _call(self, node: SimNode, feed: Callable[[], list[Command]]) -> list[Command]:
        commands = feed()
        self.log.extend(node.core.take_log())
        if node.core.idle:  # between operations: what changed goes to the journal
            changes = node.core.take_changes()
            if changes is not None:
                declared = node.core.spec.children
                self.journal.append(
                    change_record(
                        node.core.path,
                        node.incarnation,
                        changes,
                        lambda row: None if any(c is row.spec for c in declared) else row.spec,
                    )
                )
        return commands

    def _handle(self, node: SimNode, event: Event) -> list[Command]:
        return self._call(node, lambda: node.core.handle(event, self.now))

    def _deliver(self, node: SimNode, event: Event) -> None:
        result = self._pump(node, self._handle(node, event))
        if isinstance(result, Exit):
            self._exited(node, result.reason)

    def _exited(self, node: SimNode, reason: object, gone: bool = False) -> None:
        """A supervisor exited by itself: for its parent this is an ordinary child exit."""
        if not gone:
            del self._nodes[node.core.path]
        self.trace.append(("exit", node.core.path, reason))
        if node.owner is not None:
            self._owned_exited(node, node.owner, reason)
        elif node.parent is None:
            self.root_exit = reason
        else:
            self._deliver(node.parent, ChildExited(node.id, node.incarnation, reason))

    def _pump(self, node: SimNode, commands: list[Command]) -> InitDone | InitFailed | Exit | None:
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

    def _start_child(self, node: SimNode, command: StartChild) -> Event:
        if command.adopt:
            return self._adopt(node, command)
        path = f"{node.core.path}/{command.id}"
        spec = command.spec
        if isinstance(spec, Worker):
            plan = self._plans.get(path)
            outcome: StartOutcome = plan.popleft() if plan else "ok"
            if outcome == "ok" and path in self.owned:
                failure = self._start_owned(path)
                outcome = "ok" if failure is None else ("error", failure)
            self.trace.append(("start", path, outcome))
            if outcome == "ok":
                self._workers[path] = Running(node, command.id, command.incarnation)
                self._started[path] = command.incarnation
                return ChildStarted(command.id)
            if outcome == "ignore":
                return StartIgnored(command.id)
            return StartFailed(command.id, outcome[1])
        result, _ = self._start_group(spec, path, node, command.id, command.incarnation)
        if isinstance(result, InitFailed):
            return StartFailed(command.id, result.reason)
        return ChildStarted(command.id)

    def _start_group(
        self, spec: Supervisor | Mesh, path: str, parent: SimNode | None, id: str, incarnation: int
    ) -> tuple[InitDone | InitFailed | Exit | None, SimNode]:
        group = spec.as_supervisor() if isinstance(spec, Mesh) else spec
        self._specs[path] = spec
        # Incarnation counters outlive a restarted supervisor, as the trio driver's do.
        core = SupervisorCore(group, path=path, incarnations=self._counters.setdefault(path, {}))
        child = SimNode(core, parent, id, incarnation)
        self._nodes[path] = child
        self.trace.append(("sup_start", path))
        result = self._pump(child, self._call(child, lambda: child.core.start(self.now)))
        if isinstance(result, InitFailed):
            del self._nodes[path]
        return result, child

    def _terminate_child(self, node: SimNode, command: TerminateChild) -> Event:
        path = f"{node.core.path}/{command.id}"
        if command.shutdown is BRUTAL_KILL:
            reason: object = KILLED
            self._kill_subtree(path)
        elif path in self._workers:
            reason = SHUTDOWN
            del self._workers[path]
            self._stop_owned(path)
        else:
            child = self._nodes[path]
            result = self._pump(child, self._handle(child, Stop(SHUTDOWN)))
            reason = result.reason if isinstance(result, Exit) else SHUTDOWN
            del self._nodes[path]
        self.trace.append(("exit", path, reason))
        return ChildTerminated(command.id, command.incarnation, reason)

    def _kill_subtree(self, path: str) -> None:
        """Killing a supervisor kills its descendants concurrently (in no defined order);
        what killed owners own is stopped in order, as after any exit of theirs."""
        tree = tree_of(path, self.owned)
        below = sorted(
            p for p in self.running() if p.startswith(path + "/") and tree_of(p, self.owned) == tree
        )
        for p in reversed(below):
            self._workers.pop(p, None)
            self._nodes.pop(p, None)
            self.trace.append(("exit", p, KILLED))
        self._workers.pop(path, None)
        self._nodes.pop(path, None)
        for p in [path, *reversed(below)]:
            self._stop_owned(p)

    def _record_reply(self, reply: Reply) -> None:
        sup, op = self._calls[reply.ref]
        outcome: object = reply.outcome.value
        if reply.outcome is Outcome.START_ERROR:
            outcome = ("start_error", reply.reason)
        self.trace.append(("reply", sup, op, outcome))


def simulate(
    tree: Supervisor,
    steps: Iterable[ModelStep] = (),
    *,
    start_plans: Mapping[str, Sequence[StartOutcome]] | None = None,
    owned: Owned | None = None,
    stop: bool = True,
) -> Simulation:
    """Start `tree`, apply `steps`, stop it (unless `stop=False`); return the finished run.
    `owned` maps an owner worker's path to the spec its actor starts in on_start."""
    sim = Simulation(tree, start_plans=dict(start_plans or {}), owned=dict(owned or {}))
    return sim.start().run(steps, stop=stop)
