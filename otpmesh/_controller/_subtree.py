"""Trees run for an owner: a declared subtree (``otpmesh.context().start(spec)``) or a supervised
mesh (``ProcMesh.spawn_supervised``), run by the controller under the owner's path.

Inside, OTP's rules as in any tree. When the subtree gives up, its owner crashes with the
subtree's ``SupervisorError`` as its reason, so the owner's own supervisor applies its strategy:
escalation crosses levels as it does inside one tree. When the owner exits, the subtree is
stopped (``_owners.py``). Its events go to the owner's tree's log, under the owner's path, and
the owner's tree finds its supervisors (``which_children``) and actors (``actor``, ``mesh``).
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from .._core._errors import SpawnError
from .._core._exits import ActorCrash
from .._core._signature import Endpoints
from .._core._spec import Mesh, Supervisor
from .._node._mesh import ActorRef, Slot
from .._runtime._controller_runtime import Runtime
from ._app import App, PlacementName, context, run_tree
from ._owners import STOP_TIMEOUT, owners
from ._placement import LocalPlacement, ProcsPlacement
from ._tree import TreeContext

log = logging.getLogger("otpmesh.subtree")


class OwnedTree:
    """A running subtree and how to stop it (its owner's exit, or the owner's own request)."""

    def __init__(self, label: str, owner: str | None) -> None:
        self.label = label
        self.owner = owner
        self.app: App | None = None
        self.error: BaseException | None = None
        self._stopping = trio.Event()
        self.done = trio.Event()

    async def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop it in OTP order (children in reverse start order); its processes then go."""
        self._stopping.set()
        with trio.move_on_after(timeout * 4):  # shutdown timeouts apply inside
            await self.done.wait()


async def start_owned(
    rt: Runtime,
    spec: Supervisor | Mesh,
    owner: str | None,
    placement: PlacementName | ProcsPlacement = "procs",
) -> OwnedTree:
    """Start `spec` under `owner`'s path (None: at the top, as the controller's); return once
    it runs, or raise SpawnError saying why it did not start."""
    if rt.nursery is None:
        raise SpawnError("the otpmesh runtime is not running")
    label = f"{owner}/{spec.id}" if owner else spec.id
    tree = OwnedTree(label, owner)
    parent = _tree_of(rt, owner)
    if placement == "procs" and parent is not None and isinstance(parent.placement, LocalPlacement):
        placement = "local"  # an in-process tree's owned trees run in-process too
    ready = trio.Event()

    async def run() -> None:
        try:
            async with run_tree(
                spec,
                placement=placement,
                prefix=owner,
                events=parent.events if parent is not None else None,
                slots=parent.owned_slots if parent is not None else None,
            ) as app:
                tree.app = app
                if parent is not None:
                    parent.subtrees.append(context(app))
                ready.set()
                await tree._stopping.wait()
        except Exception as exc:
            tree.error = exc
            _forget(parent, tree)
            if tree.app is not None and not tree._stopping.is_set():
                log.error("%s gave up: %s", label, exc)
                if owner is not None:
                    await _escalate(rt, parent, owner, exc)
        finally:
            _forget(parent, tree)
            owners(rt).discard(owner, tree)
            ready.set()
            tree.done.set()

    rt.nursery.start_soon(run)
    await ready.wait()
    if tree.app is None:
        raise SpawnError(f"starting {label} failed: {tree.error}") from tree.error
    owners(rt).add(owner, tree)
    return tree


def _forget(parent: TreeContext | None, tree: OwnedTree) -> None:
    """The owner's tree no longer finds `tree` by path (it ended, or is escalating)."""
    if parent is not None and tree.app is not None and context(tree.app) in parent.subtrees:
        parent.subtrees.remove(context(tree.app))


async def _escalate(rt: Runtime, parent: TreeContext | None, owner: str, exc: Exception) -> None:
    """Crash `owner` with the subtree's error. Its tree counts this as work until the owner has
    announced its exit (which comes before the crash's reply), so ``settled()`` waits for the
    owner's restart too."""
    if parent is not None:
        parent.work_started()
    try:
        await crash_owner(rt, owner, ActorCrash.of(exc))
    finally:
        if parent is not None:
            parent.work_done()


def _tree_of(rt: Runtime, path: str | None) -> TreeContext | None:
    """The running tree that supervises the actor at `path`, if a tree does."""
    listener = rt.exit_listeners.get(path) if path is not None else None
    return listener if isinstance(listener, TreeContext) else None


def owner_ref(rt: Runtime, owner: str) -> ActorRef | None:
    """A ref to the running actor at `owner` (in a worker or in the controller), or None."""
    if owner in rt.node.actors:
        return ActorRef(owner, Endpoints({}), Slot(owner, rt.node.addr))
    for proc in rt.procs.values():
        if owner in proc.names and proc.alive and proc.conn is not None:
            return ActorRef(owner, Endpoints({}), Slot(owner, proc.addr, proc))
    return None


async def crash_owner(rt: Runtime, owner: str, reason: ActorCrash) -> bool:
    """Crash the running actor at `owner` with `reason` (what it owned failed and nobody handled
    it). False when it is not running any more."""
    cell = rt.node.actors.get(owner)
    if cell is not None:
        cell.crash(reason)
        return True
    for proc in rt.procs.values():
        if owner in proc.names and proc.alive and proc.conn is not None:
            fault = {"id": owner, "kind": "crash", "reason": reason}
            try:
                crashed: Any = await rt.node.sys_call(proc.conn, "inject", fault, owner)
            except Exception:
                return False
            if crashed:
                return True
    return False
