"""The state of a running tree as a table: a sans-IO model fed the app's log entries.

``otpmesh run`` draws it; tests feed it ``LogEntry`` sequences. It knows the tree from its spec
and learns everything else (states, incarnations, restarts, exit reasons) from the event log, so
it needs nothing from the running application but ``app.events``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .._core._exits import describe
from .._core._outline import OutlineRow, outline
from .._core._reasons import is_normal_exit
from .._core._spec import Mesh, Restart, Supervisor
from .._core._supevents import LogEntry, LogKind

# What a node can be doing. A restart is expected after an exit when the child's restart type
# asks for one; the supervisor's next entries confirm it (or say it gave up).
STARTING = "starting"
RUNNING = "running"
RESTARTING = "restarting"
EXITED = "exited"
STOPPED = "stopped"
START_FAILED = "start failed"
IGNORED = "ignored"
GAVE_UP = "gave up"
ESCALATING = "escalating"
AUTO_SHUTDOWN = "auto shutdown"


@dataclass
class NodeView:
    """One node of the tree as the log has shown it so far."""

    path: str
    kind: str  # "supervisor", "mesh", "worker", or "child" (a dynamic child not in the spec)
    detail: str = ""  # strategy and intensity, shape, actor class
    restart: str = Restart.PERMANENT
    state: str = STARTING
    incarnation: int | None = None
    starts: int = 0
    faults: int = 0
    last_exit: object = None  # the last exit that was not its supervisor stopping it
    children: list[str] = field(default_factory=list)
    pending_restart: bool = False  # supervisors: an exit is being handled by restarting
    intensity: int | None = None  # supervisors and meshes: at most this many restarts ...
    period: float | None = None  # ... within this many seconds
    restart_times: list[float] = field(default_factory=list)  # supervisors: when they restarted

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]

    @property
    def restarts(self) -> int:
        return max(self.starts - 1, 0)

    def intensity_used(self, now: float) -> str:
        """``used/limit in PERIODs``: the restarts of the last ``period`` seconds against
        ``intensity`` (OTP gives up past the limit); empty for a worker."""
        if self.intensity is None or self.period is None:
            return ""
        used = sum(now - t < self.period for t in self.restart_times)
        return f"{used}/{self.intensity} in {self.period:g}s"


class TreeView:
    """Feed it log entries in order (``feed``); read it as rows (``table``), as text lines
    (``lines``) or by path."""

    def __init__(self, tree: Supervisor | Mesh | Sequence[OutlineRow]) -> None:
        rows = outline(tree) if isinstance(tree, Supervisor | Mesh) else list(tree)
        if not rows:
            raise ValueError("a tree view needs at least its root")
        self.root = rows[0][0]
        self.nodes: dict[str, NodeView] = {}
        self.started_at: float | None = None
        self.now: float | None = None
        self.events = 0
        for path, kind, detail, restart, intensity, period in rows:
            node = self._add(path, kind, detail, restart)
            node.intensity, node.period = intensity, period

    def extend(self, rows: Sequence[OutlineRow]) -> None:
        """Add an owned subtree's outline (``otpmesh watch``): its supervisors get their
        strategy and intensity; nodes already seen in the log keep what the log said."""
        for path, kind, detail, restart, intensity, period in rows:
            node = self.nodes.get(path)
            if node is None:
                node = self._add(path, kind, detail, restart)
            else:
                node.kind, node.detail = kind, detail
                node.restart = restart or node.restart
            node.intensity, node.period = intensity, period

    def _add(self, path: str, kind: str, detail: str = "", restart: str = "") -> NodeView:
        node = self.nodes[path] = NodeView(path, kind, detail, restart or Restart.PERMANENT)
        parent = path.rpartition("/")[0]
        if parent:
            self._node(parent, "supervisor").children.append(path)
        return node

    def _node(self, path: str, kind: str = "child") -> NodeView:
        node = self.nodes.get(path)
        return node if node is not None else self._add(path, kind)

    def __getitem__(self, path: str) -> NodeView:
        return self.nodes[path]

    # ------------------------------------------------------------------ the model

    def feed(self, entry: LogEntry) -> None:
        """Apply one log entry (they must come in log order)."""
        self.events += 1
        self.now = entry.time
        if self.started_at is None:
            self.started_at = entry.time
        sup = self._node(entry.path, "supervisor")
        node = self._node(entry.child_path) if entry.child is not None else sup
        kind = LogKind(entry.kind)
        if kind is LogKind.SUPERVISOR_STARTED:
            sup.state = RUNNING
            if entry.path == self.root:  # a child supervisor's starts are counted by its parent
                sup.starts += 1
        elif kind in (LogKind.CHILD_STARTED, LogKind.CHILD_ADOPTED):
            node.state, node.incarnation = RUNNING, entry.incarnation
            node.starts += kind is LogKind.CHILD_STARTED  # an adopted one was not started again
            sup.pending_restart = False
        elif kind is LogKind.START_FAILED:
            node.state, node.last_exit = START_FAILED, entry.reason
        elif kind is LogKind.START_IGNORED:
            node.state = IGNORED
        elif kind is LogKind.CHILD_EXITED:
            node.last_exit = entry.reason
            node.state = RESTARTING if _restarts(node, entry.reason) else EXITED
            sup.pending_restart = node.state == RESTARTING
            if sup.pending_restart:
                sup.restart_times.append(entry.time)  # what OTP's intensity counts
        elif kind is LogKind.CHILD_TERMINATED:
            # Stopped by its supervisor: for a sibling's restart (one_for_all, rest_for_one), or
            # for good. Only an abnormal reason ('killed') is worth showing as its last exit.
            node.state = RESTARTING if sup.pending_restart else STOPPED
            if not is_normal_exit(entry.reason):
                node.last_exit = entry.reason
        elif kind is LogKind.SHUTDOWN_ERROR:
            node.last_exit = entry.reason
        elif kind in (LogKind.RESTART_INTENSITY_REACHED, LogKind.ESCALATED):
            sup.state = GAVE_UP if kind is LogKind.RESTART_INTENSITY_REACHED else ESCALATING
            sup.last_exit, sup.pending_restart = entry.reason, False
            if node is not sup and node.state == RESTARTING:
                node.state = EXITED  # the restart it was waiting for will not come
        elif kind is LogKind.AUTO_SHUTDOWN:
            sup.state, sup.pending_restart = AUTO_SHUTDOWN, False
        elif kind is LogKind.SUPERVISOR_EXITED:
            sup.pending_restart = False
            if is_normal_exit(entry.reason):
                sup.state = STOPPED if sup.state == RUNNING else sup.state
            else:
                sup.state, sup.last_exit = EXITED, entry.reason
        elif kind is LogKind.FAULT_INJECTED:
            node.faults += 1

    # ------------------------------------------------------------------ reading it

    def workers(self) -> list[NodeView]:
        return [n for n in self.nodes.values() if n.kind in ("worker", "child") and not n.children]

    def faults(self) -> int:
        return sum(n.faults for n in self.nodes.values())

    def summary(self, now: float | None = None) -> str:
        """One line: actors running, restarts, faults, events, time from the first entry to
        `now` (default: the last entry)."""
        workers = self.workers()
        running = sum(n.state == RUNNING for n in workers)
        restarts = sum(n.restarts for n in workers)
        parts = [f"{running}/{len(workers)} actors running", f"{restarts} actor restarts"]
        if self.faults():
            parts.append(f"{self.faults()} faults injected")
        now = self.now if now is None else now
        if self.started_at is not None and now is not None:
            parts.append(f"{self.events} events in {now - self.started_at:.1f} s")
        root = self.nodes[self.root]
        return f"{self.root} {root.state}: " + ", ".join(parts)

    def table(self, now: float | None = None) -> list[tuple[str, ...]]:
        """The tree as rows of cells, a header first, then parents before children, children in
        start order; the NAME cell draws the tree. INTENSITY is a supervisor's restarts within
        its period at `now` (default: the last entry) of the most it allows. FAULTS is left out
        until there are some."""
        rows: list[tuple[str, ...]] = [
            ("NAME", "KIND", "STATE", "INC", "RESTARTS", "INTENSITY", "FAULTS", "LAST EXIT")
        ]
        at = self.now if now is None else now
        self._rows(self.root, "", "", rows, 0.0 if at is None else at)
        if not self.faults():
            rows = [r[:6] + r[7:] for r in rows]
        return rows

    def lines(self) -> list[str]:
        """The table as aligned text lines (for a pipe or a log file)."""
        rows = self.table()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = []
        for row in rows:
            cells = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
            lines.append(f"{cells}  {row[-1]}" if row[-1] else cells.rstrip())
        return lines

    def _rows(
        self, path: str, lead: str, child_lead: str, rows: list[tuple[str, ...]], now: float
    ) -> None:
        node = self.nodes[path]
        inc = "" if node.incarnation is None else f"#{node.incarnation}"
        last = "" if node.last_exit is None else describe(node.last_exit)
        kind = f"{node.kind} {node.detail}".strip()
        faults = str(node.faults) if node.faults else ""
        used = node.intensity_used(now)
        rows.append(
            (lead + node.name, kind, node.state, inc, str(node.restarts), used, faults, last)
        )
        for i, child in enumerate(node.children):
            last_child = i == len(node.children) - 1
            self._rows(
                child,
                child_lead + ("└── " if last_child else "├── "),
                child_lead + ("    " if last_child else "│   "),
                rows,
                now,
            )


def _restarts(node: NodeView, reason: object) -> bool:
    """Whether the child's restart type asks for a restart after exiting with `reason`."""
    if node.restart == Restart.TEMPORARY:
        return False
    return node.restart == Restart.PERMANENT or not is_normal_exit(reason)
