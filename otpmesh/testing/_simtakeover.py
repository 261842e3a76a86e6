"""The simulator's takeover (a ``Takeover`` step): every core is gone, and the tree is resumed
from the journal alone, adopting the workers that still run; then the lost ones' exits are
reported. ``SimTakeover`` is that part of ``Simulation`` (_simulate.py; its state is the
simulation's)."""

from __future__ import annotations

from collections.abc import Callable

from .._core._children import ChildInfo, ChildStatus
from .._core._livetree import LiveTree
from .._core._spec import Mesh, Supervisor, Worker
from .._core._supervisor import SupervisorCore
from .._core._supevents import (
    ChildExited,
    ChildLost,
    ChildStarted,
    Command,
    Event,
    Exit,
    InitDone,
    InitFailed,
    StartChild,
)
from ._simnodes import Running, SimNode
from ._steps import Takeover, TraceEntry
from ._trees import Owned


class SimTakeover:
    """A standby taking the simulated tree over from its journal."""

    tree: Supervisor
    owned: Owned
    trace: list[TraceEntry]
    now: float
    root_exit: object
    journal: list[dict[str, object]]
    _nodes: dict[str, SimNode]
    _workers: dict[str, Running]
    _counters: dict[str, dict[str, int]]
    _specs: dict[str, Supervisor | Mesh]
    _live: LiveTree | None
    _lost: dict[str, Running]
    _carried: dict[str, tuple[float, ...]]
    _started: dict[str, int]
    #: The simulation's driving of cores (_simulate.py).
    _call: Callable[[SimNode, Callable[[], list[Command]]], list[Command]]
    _pump: Callable[[SimNode, list[Command]], InitDone | InitFailed | Exit | None]
    _deliver: Callable[[SimNode, Event], None]
    _exited: Callable[[SimNode, object], None]

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
        self, spec: Supervisor | Mesh, path: str, parent: SimNode | None, id: str, incarnation: int
    ) -> SimNode:
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
        node = SimNode(core, parent, id, incarnation)
        self._nodes[path] = node
        self._specs[path] = spec
        result = self._pump(node, self._call(node, lambda: node.core.start(self.now)))
        if isinstance(result, Exit):  # a retry the journal saw under way gave up
            self._exited(node, result.reason)
        return node

    def _adopt(self, node: SimNode, command: StartChild) -> Event:
        path = f"{node.core.path}/{command.id}"
        if not isinstance(command.spec, Worker):
            self._resume_group(command.spec, path, node, command.id, command.incarnation)
            return ChildStarted(command.id, adopted=True)
        gone = self._lost.get(path)
        if gone is not None:
            self._lost[path] = Running(node, command.id, command.incarnation)
            return ChildLost(command.id, "lost")
        self._workers[path] = Running(node, command.id, command.incarnation)
        return ChildStarted(command.id, adopted=True)
