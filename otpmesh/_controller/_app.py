"""Running a supervision tree: ``async with otpmesh.start(tree) as app``."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import IO, Any, Literal

import trio

from .._core._actor import Actor
from .._core._errors import ChildError, SupervisorError
from .._core._exits import ActorCrash, describe
from .._core._reasons import is_normal_exit
from .._core._spec import Mesh, Supervisor, Worker, walk
from .._core._supevents import (
    ChildExited,
    DeleteChildRequest,
    LogKind,
    Outcome,
    Reply,
    RestartChildRequest,
    StartChildRequest,
    Stop,
    TerminateChildRequest,
)
from .._node._mesh import ActorMesh, ActorRef, Slot
from .._node._node import Node
from .._runtime._controller_runtime import runtime
from ._driver import SupervisorDriver
from ._events import EventLog
from ._placement import LocalPlacement, Placement, ProcsPlacement

PlacementName = Literal["procs", "local"]
_OK = (Outcome.OK, Outcome.IGNORED)


class App:
    """A running supervision tree: refs to its actors, its event log, dynamic children."""

    def __init__(self, tree: Supervisor | Mesh, events: EventLog) -> None:
        self.tree = tree
        self.events = events
        self.mesh_shapes: dict[str, dict[str, int]] = {}
        self._specs: dict[str, Supervisor | Worker | Mesh] = {}
        self._learn(tree, "")
        self._slots: dict[str, Slot] = {}
        self._watchers: dict[str, SupervisorDriver] = {}
        self._drivers: dict[str, SupervisorDriver] = {}
        self._replies: dict[int, tuple[trio.Event, list[Reply]]] = {}
        self._refs = itertools.count()
        self._work = 0
        self._exiting: set[tuple[str, int]] = set()
        self._incarnation_counters: dict[str, dict[str, int]] = {}
        self._failing_starts: dict[str, int] = {}
        self.runtime_node: Node
        self._idle = trio.Event()
        self._idle.set()
        self.root_failure: object = None
        self.stopping = False  # the app asked the root to stop (its exit is then expected)
        self._body_scope: trio.CancelScope | None = None
        self.nursery: trio.Nursery
        self.placement: Placement

    # ---------------------------------------------------------------- refs

    def actor(self, path: str) -> ActorRef:
        """A ref to the worker at `path` ('rl/reward', 'rl/rollouts/2'); valid across restarts."""
        spec = self._spec(path)
        if not isinstance(spec, Worker):
            kind = type(spec).__name__
            raise ValueError(
                f"{path} is a {kind}, not an actor: use app.mesh({path!r})"
                if isinstance(spec, Mesh)
                else f"{path} is a {kind}, not an actor"
            )
        return ActorRef(path, _endpoints(spec.actor), self.slot(path))

    def mesh(self, path: str) -> ActorMesh:
        """The actor mesh of the Mesh spec at `path`, shaped as declared; valid across restarts."""
        spec = self._spec(path)
        if not isinstance(spec, Mesh):
            raise ValueError(f"{path} is a {type(spec).__name__}, not a Mesh: use app.actor()")
        slots = [self.slot(f"{path}/{rank}") for rank in range(spec.size)]
        return ActorMesh(path, _endpoints(spec.actor), dict(spec.shape), slots, None)

    def _spec(self, path: str) -> Supervisor | Worker | Mesh:
        spec = self._specs.get(path)
        if spec is None:
            known = ", ".join(sorted(self._specs))
            raise KeyError(f"no child at {path!r} in this tree (paths: {known})")
        return spec

    def _learn(self, spec: Supervisor | Worker | Mesh, parent: str) -> None:
        for path, node in walk(spec, parent):
            self._specs[path] = node
            if isinstance(node, Mesh):
                self.mesh_shapes[path] = dict(node.shape)
                for rank in range(node.size):
                    self._specs[f"{path}/{rank}"] = node.as_supervisor().children[rank]

    # ---------------------------------------------------------------- slots (driver side)

    def slot(self, path: str) -> Slot:
        slot = self._slots.get(path)
        if slot is None:
            slot = self._slots[path] = Slot(path, "", None, supervised=True, up=False)
        return slot

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
        """Wait until no supervisor has work pending (exits handled, restarts done)."""
        while self._work:
            await self._idle.wait()
        await trio.lowlevel.checkpoint()

    # ---------------------------------------------------------------- dynamic children

    async def start_child(self, sup_path: str, spec: Worker | Supervisor | Mesh) -> Outcome:
        """OTP's start_child: add `spec` to the supervisor at `sup_path` and start it."""
        driver = self._driver(sup_path)
        if spec.id and f"{sup_path}/{spec.id}" not in self._specs:
            self._learn(spec, sup_path)
        return await self._request(
            driver, lambda ref: StartChildRequest(ref, spec), f"{sup_path}/{spec.id}"
        )

    async def terminate_child(self, path: str) -> Outcome:
        """OTP's terminate_child: stop the child at `path`, keep its spec (unless temporary)."""
        sup, child = self._split(path)
        return await self._request(sup, lambda ref: TerminateChildRequest(ref, child), path)

    async def restart_child(self, path: str) -> Outcome:
        """OTP's restart_child: start again a child whose spec is kept but is not running."""
        sup, child = self._split(path)
        return await self._request(sup, lambda ref: RestartChildRequest(ref, child), path)

    async def delete_child(self, path: str) -> Outcome:
        """OTP's delete_child: forget the spec of a child that is not running."""
        sup, child = self._split(path)
        return await self._request(sup, lambda ref: DeleteChildRequest(ref, child), path)

    def _split(self, path: str) -> tuple[SupervisorDriver, str]:
        sup_path, _, child = path.rpartition("/")
        return self._driver(sup_path), child

    def _driver(self, sup_path: str) -> SupervisorDriver:
        driver = self._find_driver(sup_path)
        if driver is None:
            raise KeyError(f"no running supervisor at {sup_path!r}")
        return driver

    def _find_driver(self, sup_path: str) -> SupervisorDriver | None:
        stack = [self.root]
        while stack:
            driver = stack.pop()
            if driver.path == sup_path and not driver.exited.is_set():
                return driver
            stack.extend(driver.children.values())
        return None

    async def _request(self, driver: SupervisorDriver, make: Any, path: str) -> Outcome:
        ref = next(self._refs)
        done: tuple[trio.Event, list[Reply]] = (trio.Event(), [])
        self._replies[ref] = done
        driver.post(make(ref))
        await done[0].wait()
        reply = done[1][0]
        if reply.outcome in _OK:
            return reply.outcome
        raise ChildError(path, reply.outcome, reply.reason)

    def reply(self, reply: Reply) -> None:
        waiting = self._replies.pop(reply.ref, None)  # type: ignore[call-overload]
        if waiting is not None:
            waiting[1].append(reply)
            waiting[0].set()

    # ---------------------------------------------------------------- the root

    root: SupervisorDriver

    def root_exited(self, reason: object) -> None:
        """The root stopped by itself: gave up (a failure), or auto-shutdown (a normal end)."""
        if self.stopping:
            return
        gave_up = any(
            e.path == self.root.path
            and e.kind in (LogKind.RESTART_INTENSITY_REACHED, LogKind.ESCALATED)
            for e in self.events
        )
        if gave_up or not is_normal_exit(reason):
            self.root_failure = reason
        if self._body_scope is not None:
            self._body_scope.cancel()

    def failure(self) -> SupervisorError:
        """The error that says why the root gave up: which supervisor, and the last exits."""
        reached = self.events.of_kind(LogKind.RESTART_INTENSITY_REACHED)
        exits = [e for e in self.events if e.kind in (LogKind.CHILD_EXITED, LogKind.START_FAILED)]
        last = "; ".join(f"{e.child_path} {describe(e.reason)}" for e in exits[-3:])
        if reached:
            where = reached[0]
            sup = self._spec(where.path)
            limit = f"{getattr(sup, 'intensity', '?')} restarts in {getattr(sup, 'period', '?')} s"
            head = f"supervisor {where.path} reached its restart intensity ({limit})"
        else:
            head = f"supervisor {self.root.path} exited: {describe(self.root_failure)}"
        return SupervisorError(head + (f"; last exits: {last}" if last else ""), self.root_failure)


def _endpoints(actor: type | str) -> frozenset[str]:
    if isinstance(actor, type) and issubclass(actor, Actor):
        return frozenset(actor.endpoints())
    return frozenset()  # an import path: the controller need not import it to call it


@asynccontextmanager
async def start(
    tree: Supervisor | Mesh,
    *,
    placement: PlacementName | ProcsPlacement = "procs",
    events_file: IO[str] | None = None,
) -> AsyncIterator[App]:
    """Start a supervision tree; stop it (children in reverse start order) when the block ends.

    ``placement="procs"`` runs every actor in a worker process of its own; ``"local"`` runs them
    all in this process with identical supervision, for fast deterministic tests. If the root
    supervisor gives up, the block is cancelled and ``SupervisorError`` says where and why.
    """
    if not isinstance(tree, Supervisor | Mesh):
        raise TypeError(f"otpmesh.start needs a Supervisor or Mesh spec, not {tree!r}")
    if not isinstance(placement, ProcsPlacement) and placement not in ("procs", "local"):
        raise ValueError(f"placement must be 'procs' or 'local', not {placement!r}")
    rt = await runtime()
    app = App(tree, EventLog(events_file))
    app.runtime_node = rt.node
    for path in app._specs:
        rt.exit_listeners[path] = app
    try:
        async with _collapse(), trio.open_nursery() as nursery:
            app.nursery = nursery
            if isinstance(placement, ProcsPlacement):  # a proc mesh's own processes
                app.placement = placement
            elif placement == "procs":
                app.placement = ProcsPlacement(rt)
            else:
                app.placement = LocalPlacement(rt, app, nursery)
            app.root = SupervisorDriver(app, _as_supervisor(tree), tree.id, None)
            nursery.start_soon(app.root.run)
            await app.root.started.wait()
            try:
                if app.root.init_failure is None:
                    with trio.CancelScope() as scope:
                        app._body_scope = scope
                        yield app
            finally:
                with trio.CancelScope(shield=True):
                    await _stop_tree(app)
                nursery.cancel_scope.cancel()
    finally:
        for path in app._specs:
            rt.exit_listeners.pop(path, None)
    if app.root.init_failure is not None:
        reason = app.root.init_failure
        raise SupervisorError(f"supervisor {tree.id} failed to start: {describe(reason)}", reason)
    if app.root_failure is not None:
        raise app.failure()


@asynccontextmanager
async def _collapse() -> AsyncIterator[None]:
    """Let the body's own exception through as itself, not wrapped in a nursery's group."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


def _as_supervisor(tree: Supervisor | Mesh) -> Supervisor:
    return tree.as_supervisor() if isinstance(tree, Mesh) else tree


async def _stop_tree(app: App) -> None:
    """Stop the root (children in reverse start order), then the processes, then the log."""
    app.stopping = True
    if not app.root.exited.is_set():
        app.root.post(Stop("shutdown"))
        await app.root.exited.wait()
    await app.placement.close()
    app.events.close()
