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

from .._core._children import ChildInfo, ChildStatus
from .._core._exits import ActorCrash, describe
from .._core._giveup import gave_up, give_up_error, root_run
from .._core._livetree import LiveTree, change_record
from .._core._reasons import KILLED, SHUTDOWN, is_normal_exit
from .._core._spec import BRUTAL_KILL, Mesh, Supervisor, Worker
from .._core._supervisor import SupervisorCore
from .._core._supevents import (
    ChildExited,
    ChildLost,
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


@dataclass(slots=True)
class _Node:
    core: SupervisorCore
    parent: _Node | None
    id: str
    incarnation: int
    owner: str | None = None  # an owned subtree's root: the worker that started it


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
    #: Owner worker path -> the spec its actor starts in on_start (``context().start``).
    owned: Owned = field(default_factory=dict)
    now: float = 0.0
    trace: list[TraceEntry] = field(default_factory=list)
    log: list[LogEntry] = field(default_factory=list)
    root_exit: object = None
    _nodes: dict[str, _Node] = field(default_factory=dict)
    _workers: dict[str, _Running] = field(default_factory=dict)
    _plans: dict[str, deque[StartOutcome]] = field(default_factory=dict)
    _calls: dict[object, tuple[str, str]] = field(default_factory=dict)
    _counters: dict[str, dict[str, int]] = field(default_factory=dict)
    _subtrees: dict[str, _Node] = field(default_factory=dict)  # owner path -> subtree root
    _specs: dict[str, Supervisor | Mesh] = field(default_factory=dict)  # supervisors' specs
    #: The takeover journal's child-list records, oldest first (since the last takeover).
    journal: list[dict[str, object]] = field(default_factory=list)
    _live: LiveTree | None = None  # during a takeover: the journal folded
    _lost: dict[str, _Running] = field(default_factory=dict)  # during one: died in the gap
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
        root = _Node(SupervisorCore(self.tree), None, self.tree.id, 1)
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

    # ---- a takeover ------------------------------------------------------------------------

    def _takeover(self, step: Takeover) -> None:
        """Every core is gone; the tree is resumed from the journal alone, adopting the
        workers that still run, then the lost ones' exits are reported, one at a time."""
        if self.owned:
            raise NotImplementedError("the model takes over trees without owned subtrees")
        live = LiveTree()
        for record in self.journal:
            live.add(record)
        self.journal = []  # the standby's run journals the resumed tree afresh
        # Each supervisor's restarts inside its period: the journal's restart records.
        self._carried = {path: node.core.restarts for path, node in self._nodes.items()}
        workers, self._nodes, self._workers = self._workers, {}, {}
        # The standby's incarnation counters: the journal's, as it seeds them.
        self._counters = {}
        for path, incarnation in self._started.items():
            sup, _, child = path.rpartition("/")
            self._counters.setdefault(sup, {})[child] = incarnation
        for sup, counters in live.counters().items():
            mine = self._counters.setdefault(sup, {})
            for child_id, number in counters.items():
                mine[child_id] = max(mine.get(child_id, 0), number)
        self._lost = {p: workers[p] for p in step.lost if p in workers}
        self._live = live
        try:
            root = self._resume_group(self.tree, self.tree.id, None, self.tree.id, 1)
        finally:
            self._live = None
        for path, gone in self._lost.items():
            # Adopted as running, reported now as any exit: the tree is whole again.
            self.trace.append(("exit", path, step.reason))
            node = self._nodes.get(gone.parent.core.path)
            if node is not None:
                self._deliver(node, ChildExited(gone.id, gone.incarnation, step.reason))
        self._lost = {}
        if root.core.done:
            self.root_exit = root.core.exit_reason

    def _resume_group(
        self, spec: Supervisor | Mesh, path: str, parent: _Node | None, id: str, incarnation: int
    ) -> _Node:
        assert self._live is not None
        group = spec.as_supervisor() if isinstance(spec, Mesh) else spec
        rows = self._live.rows(path, incarnation)
        if rows is None:
            raise AssertionError(f"the journal holds no child list of {path} #{incarnation}")
        declared = {c.id: c for c in group.children}
        children = [
            ChildInfo(
                row[0], ChildStatus(row[1]), row[2], row[3] if len(row) > 3 else declared[row[0]]
            )
            for row in rows
        ]
        core = SupervisorCore(
            group,
            path=path,
            incarnations=self._counters.setdefault(path, {}),
            restarts=self._carried.pop(path, ()),
            resume=children,
        )
        node = _Node(core, parent, id, incarnation)
        self._nodes[path] = node
        self._specs[path] = spec
        result = self._pump(node, self._call(node, lambda: node.core.start(self.now)))
        if isinstance(result, Exit):  # a retry the journal saw under way gave up
            self._exited(node, result.reason)
        return node

    def _adopt(self, node: _Node, command: StartChild) -> Event:
        path = f"{node.core.path}/{command.id}"
        if not isinstance(command.spec, Worker):
            self._resume_group(command.spec, path, node, command.id, command.incarnation)
            return ChildStarted(command.id, adopted=True)
        gone = self._lost.get(path)
        if gone is not None:
            self._lost[path] = _Running(node, command.id, command.incarnation)
            return ChildLost(command.id, "lost")
        self._workers[path] = _Running(node, command.id, command.incarnation)
        return ChildStarted(command.id, adopted=True)

    # ---- owned subtrees ---------------------------------------------------------------------

    def _start_owned(self, owner: str) -> object:
        """The owner's on_start starts its subtree (before the owner counts as started);
        returns the owner's start failure reason if the subtree failed to start."""
        spec = self.owned[owner]
        path = f"{owner}/{spec.id}"
        for p in [p for p in self._counters if p == path or p.startswith(path + "/")]:
            del self._counters[p]  # a new subtree is a new tree: incarnations from 1
        result, node = self._start_group(spec, path, None, spec.id, 1)
        if isinstance(result, InitFailed):
            # SpawnError raised by context().start (otpmesh/_controller/_subtree.py).
            error = f"supervisor {spec.id} failed to start: {describe(result.reason)}"
            return ActorCrash("SpawnError", f"starting {path} failed: {error}")
        node.owner = owner
        self._subtrees[owner] = node
        return None

    def _stop_owned(self, owner: str) -> None:
        """The owner exited: its subtree is stopped in OTP order (in the background, for the
        real system: the log's per-tree order is what the machine compares)."""
        node = self._subtrees.pop(owner, None)
        if node is None or node.core.path not in self._nodes:
            return
        result = self._pump(node, self._handle(node, Stop(SHUTDOWN)))
        self._nodes.pop(node.core.path, None)
        reason = result.reason if isinstance(result, Exit) else SHUTDOWN
        self.trace.append(("exit", node.core.path, reason))

    def _owned_exited(self, node: _Node, owner: str, reason: object) -> None:
        """An owned subtree's root exited by itself: if it gave up, its owner crashes with
        the subtree's SupervisorError; an auto-shutdown (a normal exit) leaves the owner be."""
        if self._subtrees.get(owner) is not node:
            return  # stopped by (or with) its owner
        del self._subtrees[owner]
        path = node.core.path
        run = root_run(self.log, path, lambda p: tree_of(p, self.owned) == owner)
        if gave_up(run, path) or not is_normal_exit(reason):
            error = give_up_error(run, path, reason, self._specs.__getitem__)
            self._crash(owner, ActorCrash("SupervisorError", str(error)))

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
        if node.owner is not None:
            self._owned_exited(node, node.owner, reason)
        elif node.parent is None:
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
                self._workers[path] = _Running(node, command.id, command.incarnation)
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
        self, spec: Supervisor | Mesh, path: str, parent: _Node | None, id: str, incarnation: int
    ) -> tuple[InitDone | InitFailed | Exit | None, _Node]:
        group = spec.as_supervisor() if isinstance(spec, Mesh) else spec
        self._specs[path] = spec
        # Incarnation counters outlive a restarted supervisor, as the trio driver's do.
        core = SupervisorCore(group, path=path, incarnations=self._counters.setdefault(path, {}))
        child = _Node(core, parent, id, incarnation)
        self._nodes[path] = child
        self.trace.append(("sup_start", path))
        result = self._pump(child, self._call(child, lambda: child.core.start(self.now)))
        if isinstance(result, InitFailed):
            del self._nodes[path]
        return result, child

    def _terminate_child(self, node: _Node, command: TerminateChild) -> Event:
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
