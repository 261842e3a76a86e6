"""A running tree's internal state: what its supervisor drivers, the runtime (as the exit
listener of its actors), ``otpmesh.chaos`` and the testing toolkit work with. ``App`` is the
users' façade over it (_app.py)."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._core._errors import SupervisorError
from .._core._exits import ActorCrash
from .._core._giveup import gave_up, give_up_error, root_run
from .._core._healspec import Heal
from .._core._reasons import is_normal_exit
from .._core._spec import Mesh, Supervisor, Worker, walk
from .._core._supevents import ChildExited, LogKind, Reply
from .._node._mesh import Slot
from .._node._node import Node
from ._driver import SupervisorDriver
from ._events import EventLog
from ._healpeers import check_sources
from ._livejournal import LiveJournal
from ._placement import Placement
from ._supcalls import SupervisorCalls


def _path_order(path: str) -> list[tuple[int, int | str]]:
    """'m/2' before 'm/10': numeric parts (mesh ranks) compare as numbers."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in path.split("/")]


class TreeContext(SupervisorCalls):
    """A running tree's internal state, for its drivers, the runtime (as exit listener),
    ``otpmesh.chaos`` and the testing toolkit: specs, slots, pending work, the root, the
    placement. Users see the ``App`` façade over it."""

    def __init__(
        self,
        tree: Supervisor | Mesh,
        events: EventLog,
        exit_listeners: dict[str, Any],
        prefix: str = "",
        slots: dict[str, Slot] | None = None,
    ) -> None:
        self.tree = tree
        self.events = events
        self.owns_events = True  # False: an owner's tree's log, closed by that tree
        #: Trees that actors of this one own (_subtree.py): found by path as if they were ours.
        self.subtrees: list[TreeContext] = []
        #: What its start found when it took a running tree over (``app.resumed``).
        self.resumption: Any = None
        #: Waits until what exited owners owned is stopped (set by the app: _owners.py).
        self.owners_quiet: Callable[[], Awaitable[None]] | None = None
        self.ended = trio.Event()  # the app's block is over and the tree is stopped
        self.mesh_shapes: dict[str, dict[str, int]] = {}
        self.mesh_heals: dict[str, Heal] = {}  # meshes whose restarted actors heal from a peer
        self.specs: dict[str, Supervisor | Worker | Mesh] = {}
        #: Where the runtime finds who hears an actor's exit, by path: every path this tree
        #: learns (at start, or from start_child) is ours.
        self.exit_listeners = exit_listeners
        self._learn(tree, prefix)
        # An owned tree's slots live in its app's registry of them, not in the tree: the next
        # tree its owner starts at the same paths (the owner restarted) takes them up again,
        # so a ref taken before reaches the new incarnations.
        self._slots: dict[str, Slot] = {} if slots is None else slots
        #: The registry the trees this one's actors own keep their slots in (one per app).
        self.owned_slots: dict[str, Slot] = {} if slots is None else slots
        self._watchers: dict[str, SupervisorDriver] = {}
        self._drivers: dict[str, SupervisorDriver] = {}
        self._replies: dict[int, tuple[trio.Event, list[Reply]]] = {}
        self._refs = itertools.count()
        self._work = 0
        self._exiting: set[tuple[str, int]] = set()
        self._stopping: dict[str, None] = {}  # actors asked to stop, not yet gone (in order)
        self._incarnation_counters: dict[str, dict[str, int]] = {}
        #: Restart times a takeover carried over, by supervisor path (_takeover.py).
        self.carried_restarts: dict[str, tuple[float, ...]] = {}
        #: Told of each restart (a takeover journals it); None: nobody listens.
        self.on_restart: Callable[[str, tuple[float, ...]], None] | None = None
        #: A takeover's journal of each supervisor's child list (_livejournal.py).
        self.live_journal: LiveJournal | None = None
        #: What a takeover's resume found gone: (driver, child id, incarnation, reason).
        self._lost: list[tuple[SupervisorDriver, str, int, object]] = []
        self.reported_lost = 0  # how many that was, for a tree its actor owns
        self._failing_starts: dict[str, int] = {}
        self.runtime_node: Node
        self._idle = trio.Event()
        self._idle.set()
        self.root_failure: object = None
        self.stopping = False  # the app asked the root to stop (its exit is then expected)
        self.body_scope: trio.CancelScope | None = None
        self.nursery: trio.Nursery
        self.placement: Placement

    def spec(self, path: str) -> Supervisor | Worker | Mesh:
        """The spec at `path`; KeyError naming the paths there are."""
        holder = self.holder(path)
        if holder is None:
            known = ", ".join(sorted(self.specs))
            raise KeyError(f"no child at {path!r} in this tree (paths: {known})")
        return holder.specs[path]

    def holder(self, path: str) -> TreeContext | None:
        """This tree, or the tree one of its actors owns (at any depth), that has `path`."""
        if path in self.specs:
            return self
        for sub in self.subtrees:
            found = sub.holder(path)
            if found is not None:
                return found
        return None

    def _learn(self, spec: Supervisor | Worker | Mesh, parent: str) -> None:
        learned = []
        for path, node in walk(spec, parent):
            self.specs[path] = node
            learned.append(path)
            if isinstance(node, Mesh):
                self.mesh_shapes[path] = dict(node.shape)
                if isinstance(node.heal, Heal):
                    self.mesh_heals[path] = node.heal
                for rank in range(node.size):
                    self.specs[f"{path}/{rank}"] = node.as_supervisor().children[rank]
                    learned.append(f"{path}/{rank}")
        for path in learned:  # at start, and a child added by start_child: its exits reach us
            self.exit_listeners[path] = self
            learned_spec = self.specs[path]
            if isinstance(learned_spec, Mesh):  # the meshes it heals from are known now
                check_sources(path, learned_spec, self.specs)

    # ---------------------------------------------------------------- slots (driver side)

    def slot(self, path: str) -> Slot:
        slot = self._slots.get(path)
        if slot is None:
            slot = self._slots[path] = Slot(path, "", None, supervised=True, up=False)
        return slot

    def has_slot(self, path: str) -> bool:
        return path in self._slots

    def slots_under(self, sup_path: str) -> list[tuple[str, Slot]]:
        prefix = sup_path + "/"
        return [
            (p[len(prefix) :], s)
            for p, s in self._slots.items()
            if p.startswith(prefix) and "/" not in p[len(prefix) :]
        ]

    def fail_next_starts(self, path: str, count: int) -> None:
        """otpmesh.chaos: the next `count` starts of the actor at `path` fail."""
        self._failing_starts[path] = self._failing_starts.get(path, 0) + count

    def injected_start_failure(self, path: str) -> object:
        """The failure reason for this start of `path`, if chaos asked for one."""
        left = self._failing_starts.get(path, 0)
        if not left:
            return None
        self._failing_starts[path] = left - 1
        return ActorCrash("ChaosStartFailure", "start failed on purpose (otpmesh.chaos)")

    def incarnations(self, sup_path: str) -> dict[str, int]:
        """The incarnation counters of a supervisor's children, kept across its restarts."""
        return self._incarnation_counters.setdefault(sup_path, {})

    def restart_history(self, sup_path: str) -> tuple[float, ...]:
        return self.carried_restarts.pop(sup_path, ())

    def restarted(self, sup_path: str, window: tuple[float, ...]) -> None:
        if self.on_restart is not None:
            self.on_restart(sup_path, window)

    def learn(self, sup_path: str, spec: Supervisor | Worker | Mesh) -> None:
        """A child a takeover resumed that ``start_child`` had added: its paths are this
        tree's (its exits reach it, ``app.actor`` finds it)."""
        if f"{sup_path}/{spec.id}" not in self.specs:
            self._learn(spec, sup_path)

    def lost(
        self, driver: SupervisorDriver, child_id: str, incarnation: int, reason: object
    ) -> None:
        self._lost.append((driver, child_id, incarnation, reason))

    def report_lost(self) -> int:
        """Once a takeover resumed the whole tree: the exit of each child it found gone goes
        to its supervisor, all at once (they died together, while no controller ran), for
        OTP's rules to decide. How many there were."""
        lost, self._lost = self._lost, []
        for driver, child_id, incarnation, reason in lost:
            driver.post(ChildExited(child_id, incarnation, reason))
        return len(lost)

    def watch(self, path: str, driver: SupervisorDriver) -> None:
        self._watchers[path] = driver

    def actor_exiting(self, path: str, incarnation: int) -> None:
        """An actor announced its exit (crash, stop): callers wait, settled() waits for it."""
        if path not in self._watchers or (path, incarnation) in self._exiting:
            return
        self._exiting.add((path, incarnation))
        self.work_started()
        slot = self._slots.get(path)
        if slot is not None:
            slot.mark_down()

    def actor_exited(self, path: str, incarnation: int, reason: object) -> None:
        """Every actor exit lands here (inline, before later replies are read)."""
        driver = self._watchers.get(path)
        if driver is None:
            return
        slot = self._slots.get(path)
        if slot is not None:
            slot.mark_down()
        driver.post(ChildExited(path.rsplit("/", 1)[1], incarnation, reason))
        if (path, incarnation) in self._exiting:
            self._exiting.discard((path, incarnation))
            self.work_done()

    async def resolve(self, path: str) -> dict[str, Any]:
        """Where the actor at `path` lives once it is up (for refs held by other actors)."""
        slot = self.slot(path)
        await slot.wait_up()
        return {"gone": slot.gone} if slot.gone is not None else {"addr": slot.addr}

    def last_exit(self, sup_path: str, child_id: str) -> object:
        for entry in reversed(self.events._entries):
            if (
                entry.path == sup_path
                and entry.child == child_id
                and entry.kind
                in (LogKind.CHILD_EXITED, LogKind.CHILD_TERMINATED, LogKind.START_FAILED)
            ):
                return entry.reason
        return None

    def stop_begun(self, path: str) -> None:
        """A driver asked the actor at `path` to stop (TerminateChild): it is waited for."""
        self._stopping[path] = None

    def stop_ended(self, path: str) -> None:
        self._stopping.pop(path, None)

    def waiting_for(self) -> list[str]:
        """The actors asked to stop and not gone yet, in path order (ranks as numbers): what a
        stop waits for (Ctrl-C names them when it is slow)."""
        return sorted(self._stopping, key=_path_order)

    # ---------------------------------------------------------------- settling

    def work_started(self) -> None:
        self._work += 1
        if self._idle.is_set():
            self._idle = trio.Event()

    def work_done(self) -> None:
        self._work -= 1
        if self._work == 0:
            self._idle.set()

    async def settled(self) -> None:
        """Wait until no supervisor has work pending (exits handled, restarts done), in this
        tree and in the trees its actors own, and what exited owners owned is stopped."""
        while True:
            while self._work:
                await self._idle.wait()
            for sub in list(self.subtrees):
                await sub.settled()
                if sub.gave_up:
                    await sub.ended.wait()  # then its owner's crash is this tree's work
            if self.owners_quiet is not None:
                await self.owners_quiet()
            await trio.lowlevel.checkpoint()
            if not self._work and all(sub.idle for sub in self.subtrees):
                return

    @property
    def idle(self) -> bool:
        return not self._work and all(sub.idle and not sub.gave_up for sub in self.subtrees)

    @property
    def gave_up(self) -> bool:
        """Its root stopped by itself, with a failure (not asked to): it is ending."""
        return self.root_failure is not None

    # ---------------------------------------------------------------- the root

    root: SupervisorDriver

    def root_exited(self, reason: object) -> None:
        """The root stopped by itself: gave up (a failure), or auto-shutdown (a normal end)."""
        if self.stopping:
            return
        run = root_run(self.events, self.root.path, self.specs.__contains__)
        if gave_up(run, self.root.path) or not is_normal_exit(reason):
            self.root_failure = reason
        if self.body_scope is not None:
            self.body_scope.cancel()

    def failure(self) -> SupervisorError:
        """The error that says why the root gave up: which supervisor, and the last exits (of
        this tree's supervisors only: an owned subtree shares the log, _giveup.py)."""
        run = root_run(self.events, self.root.path, self.specs.__contains__)
        return give_up_error(run, self.root.path, self.root_failure, self.spec)

    def worker_paths(self) -> list[str]:
        """Every actor path of the tree (workers, and mesh members), in a fixed order."""
        own = [p for p, spec in sorted(self.specs.items()) if isinstance(spec, Worker)]
        return own + [p for sub in self.subtrees for p in sub.worker_paths()]
