"""The simulator's owned subtrees: the tree an owner worker's actor starts in ``on_start``,
stopped when the owner exits, and crashing its owner when it gives up. ``SimOwned`` is that part
of ``Simulation`` (_simulate.py; its state is the simulation's)."""

from __future__ import annotations

from collections.abc import Callable

from .._core._exits import ActorCrash, describe
from .._core._giveup import gave_up, give_up_error, root_run
from .._core._reasons import SHUTDOWN, is_normal_exit
from .._core._spec import Mesh, Supervisor
from .._core._supevents import Command, Event, Exit, InitDone, InitFailed, LogEntry, Stop
from ._simnodes import SimNode
from ._steps import TraceEntry
from ._trees import Owned, tree_of


class SimOwned:
    """The subtrees owner workers start, keyed by owner path."""

    owned: Owned
    trace: list[TraceEntry]
    log: list[LogEntry]
    _nodes: dict[str, SimNode]
    _counters: dict[str, dict[str, int]]
    _subtrees: dict[str, SimNode]
    _specs: dict[str, Supervisor | Mesh]
    #: The simulation's driving of cores (_simulate.py).
    _start_group: Callable[
        [Supervisor | Mesh, str, SimNode | None, str, int],
        tuple[InitDone | InitFailed | Exit | None, SimNode],
    ]
    _pump: Callable[[SimNode, list[Command]], InitDone | InitFailed | Exit | None]
    _handle: Callable[[SimNode, Event], list[Command]]
    _crash: Callable[[str, object], None]

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

    def _owned_exited(self, node: SimNode, owner: str, reason: object) -> None:
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
