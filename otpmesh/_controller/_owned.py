"""The controller's answers to what any process of the app may ask (``_node/_ask.py``): start
processes or a subtree for an actor, spawn on or stop a proc mesh, stop an actor mesh, look an
actor up by path, get or start a singleton. Registered on the controller's node when its runtime
starts; the same handlers serve the controller's own calls.
"""

from __future__ import annotations

import math
import os
import secrets
from typing import Any

import trio

from .._core._actor import set_start_hook
from .._core._errors import ActorError, MeshError, SingletonError
from .._core._shape import check_shape
from .._core._spec import Mesh, Restart, Strategy, Supervisor, Worker, walk
from .._node._ask import ask_controller, in_controller
from .._node._mesh import ActorMesh, ActorRef
from .._runtime import _controller_runtime, _run
from .._runtime._controller_runtime import Runtime
from .._wire._connection import Connection
from ._app import PlacementName, context, endpoints_of
from ._ownedover import SINGLETONS, journal_owned, journal_owned_done
from ._owners import STOP_TIMEOUT, check_owner, owners, proc_of
from ._placement import ProcsPlacement
from ._procmesh import ProcMesh, start_procs
from ._specwire import spec_from_wire, spec_to_wire
from ._subtree import OwnedTree, start_owned
from ._tree import TreeContext

#: Processes one actor may own at once through proc_mesh() (a loop of requests from a buggy or
#: compromised actor must not fork the host out of memory); the controller's own are unbounded.
MAX_OWNED_PROCS = int(os.environ.get("OTPMESH_MAX_OWNED_PROCS", "1024"))


class Subtree:
    """A tree an actor owns (``otpmesh.context().start(spec)``): refs to its actors and meshes
    by path (the owner's path, then the spec's ids: ``service/2/replicas``), valid across
    restarts, and ``stop()``."""

    def __init__(self, root: str, key: str, refs: dict[str, ActorRef | ActorMesh]) -> None:
        self.root = root
        self._key = key  # what stop() shows the controller: only its holder may stop it
        self._refs = refs

    @property
    def paths(self) -> list[str]:
        return sorted(self._refs)

    def actor(self, path: str) -> ActorRef:
        found = self._refs.get(path)
        if not isinstance(found, ActorRef):
            raise KeyError(f"no actor at {path!r} in {self.root} (paths: {self.paths})")
        return found

    def mesh(self, path: str | None = None) -> ActorMesh:
        """The mesh at `path` (default: the root, when the subtree is a Mesh)."""
        found = self._refs.get(path or self.root)
        if not isinstance(found, ActorMesh):
            raise KeyError(f"no mesh at {path or self.root!r} in {self.root} (paths: {self.paths})")
        return found

    async def stop(self) -> None:
        """Stop it now, in OTP order (it is stopped with its owner anyway)."""
        await ask_controller("subtree_stop", {"key": self._key})

    def __repr__(self) -> str:
        return f"Subtree({self.root!r})"


async def _start_subtree(owner: str, spec: Any) -> Subtree:
    if not isinstance(spec, Supervisor | Mesh):
        raise TypeError(f"context().start needs a Supervisor or Mesh spec, not {spec!r}")
    # In the controller (placement="local") the spec is not sent: its classes are used as they
    # are, which also serves classes no import path reaches (a test's, a notebook's).
    sent = spec if in_controller() else spec_to_wire(spec)
    answer = await ask_controller("subtree_start", {"owner": owner, "spec": sent})
    return Subtree(answer["root"], answer["key"], answer["refs"])


set_start_hook(_start_subtree)


async def lookup(path: str) -> ActorRef | ActorMesh:
    """A ref to the actor, or the mesh, at `path` anywhere in this app (a tree's, one an actor
    owns, a proc mesh's): one round trip to the controller, from any process. KeyError if none."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"lookup needs an actor or mesh path, not {path!r}")
    found: ActorRef | ActorMesh = await ask_controller("lookup", {"path": path})
    return found


async def singleton(name: str, actor: type | str, *args: Any, **kwargs: Any) -> ActorRef:
    """The app's one actor called `name` (at ``singletons/NAME``): started on first use with
    ``actor(*args, **kwargs)`` and supervised like any child (restarted if it crashes). The name
    keeps that first request's class and arguments for as long as the controller runs, across
    restarts, and after its supervisor gave up (the next request starts it again, the same).
    Later calls, from any process, get a ref to the same actor and their arguments are
    ignored; a call naming another class (compared by import path) raises ``SingletonError``
    naming both."""
    spec = Worker(name, actor, args=args, kwargs=kwargs)
    if not _run.IN_WORKER:  # in the controller: its runtime may not be started yet
        await _controller_runtime.runtime()
    try:
        found: ActorRef = await ask_controller("singleton", {"spec": spec_to_wire(spec)})
    except ActorError as exc:  # asked from a worker: the controller's refusal came as data
        if exc.type_name == SingletonError.__name__:
            raise SingletonError(exc.message) from None
        raise
    return found


class Service:
    """The handlers, for one controller runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.owners = owners(rt)
        self.subtrees: dict[str, OwnedTree] = {}
        self._starting: dict[str, int] = {}  # owner -> processes being forked for it now
        self._singletons: OwnedTree | None = None
        #: Each singleton's spec as first started: its name stays bound to its class (and its
        #: arguments) after restarts and after the singletons' supervisor gave up.
        self._singleton_specs: dict[str, Worker] = {}
        self._singleton_lock = trio.Lock()
        rt.node.sys_handlers.update(
            {
                "procs_start": self.procs_start,
                "procs_spawn": self.procs_spawn,
                "procs_stop": self.procs_stop,
                "mesh_stop": self.mesh_stop,
                "subtree_start": self.subtree_start,
                "subtree_stop": self.subtree_stop,
                "lookup": self.lookup,
                "singleton": self.singleton,
            }
        )

    def _mesh(self, p: dict[str, Any]) -> ProcMesh:
        mesh = self.owners.meshes.get(p.get("id"))  # type: ignore[arg-type]
        if mesh is None:
            raise MeshError(f"no running proc mesh {p.get('id')!r} (it was stopped)")
        ranks = p.get("ranks")
        if ranks is None:
            return mesh  # type: ignore[no-any-return]
        if type(ranks) is not list or not all(type(r) is int and 0 <= r < len(mesh) for r in ranks):
            raise MeshError(f"ranks {ranks!r} are not ranks of {mesh.label}")
        shape = p.get("shape")
        if shape != {}:  # a slice that dropped every dimension is one process, shaped {}
            shape = check_shape(shape if isinstance(shape, dict) else {"": shape})
        sliced: ProcMesh = mesh._subset(ranks, shape)
        return sliced

    async def procs_start(self, conn: Connection | None, p: dict[str, Any]) -> ProcMesh:
        owner = check_owner(self.rt, conn, p.get("owner"))
        shape = check_shape(p["shape"])
        if owner is None:
            return await start_procs(self.rt, shape, owner)
        asked = math.prod(shape.values())
        owned = {  # by pid: a slice is a proc mesh of its own over the same processes
            pid
            for thing in self.owners.owns(owner)
            if isinstance(thing, ProcMesh) and not thing.stopped
            for pid in thing.pids
        }
        held = self._starting.get(owner, 0) + len(owned)
        if held + asked > MAX_OWNED_PROCS:
            raise MeshError(
                f"{owner} asked for {asked} more process(es) but owns {held} of its "
                f"{MAX_OWNED_PROCS}: stop a proc mesh it no longer needs, or raise the bound "
                "with OTPMESH_MAX_OWNED_PROCS in the controller's environment"
            )
        self._starting[owner] = self._starting.get(owner, 0) + asked
        try:
            return await start_procs(self.rt, shape, owner)
        finally:
            self._starting[owner] -= asked
            if not self._starting[owner]:
                del self._starting[owner]

    async def procs_spawn(self, conn: Connection | None, p: dict[str, Any]) -> ActorMesh:
        mesh = self._mesh(p)
        if not isinstance(p.get("cls"), str):
            raise MeshError("spawn names its actor class by import path")
        args, kwargs = list(p.get("args", [])), dict(p.get("kwargs", {}))
        supervision = p.get("supervision")
        spawner = mesh._spawners[p["name"]] = proc_of(self.rt, conn)
        asker = p.get("owner")  # the spawning actor: it hears of the actors' failures
        if isinstance(asker, str) and spawner is not None and asker in spawner.names:
            mesh._hearers[p["name"]] = asker
        if supervision is None:
            return await mesh.spawn(p["name"], p["cls"], *args, **kwargs)
        strategy, restart, intensity, period, start_timeout = supervision
        return await mesh.spawn_supervised(
            p["name"],
            p["cls"],
            args=args,
            kwargs=kwargs,
            strategy=Strategy(strategy),
            restart=Restart(restart),
            intensity=intensity,
            period=period,
            start_timeout=start_timeout,
        )

    async def procs_stop(self, conn: Connection | None, p: dict[str, Any]) -> None:
        await self._mesh(p).stop(float(p.get("timeout", STOP_TIMEOUT)))

    async def mesh_stop(self, conn: Connection | None, p: dict[str, Any]) -> None:
        path = p.get("path")
        for mesh in list(self.owners.meshes.values()):
            name = mesh._mesh_named(path)
            if name is not None:
                asker = proc_of(self.rt, conn)
                if asker is not None and not mesh._may_stop(name, asker):
                    raise MeshError(
                        f"{path} may be stopped only by its owner's process or the one that "
                        "spawned it"
                    )
                await mesh._stop_mesh(name)
                return
        if self._tree_with(path) is not None:
            raise MeshError(
                f"{path} is supervised by a tree: stop it with app.terminate_child({path!r})"
            )
        raise MeshError(f"no running actor mesh {path!r} (already stopped?)")

    async def subtree_start(self, conn: Connection | None, p: dict[str, Any]) -> dict[str, Any]:
        owner = check_owner(self.rt, conn, p.get("owner"))
        local = conn is None and isinstance(p["spec"], Supervisor | Mesh)
        spec = p["spec"] if local else spec_from_wire(p["spec"])
        if not isinstance(spec, Supervisor | Mesh):
            raise MeshError("an owned subtree's root is a Supervisor or a Mesh")
        # An owner in the controller process (a placement="local" app) keeps its subtree
        # in-process too: one process, and a MockClock drives every level.
        placement: PlacementName = "local" if conn is None and owner is not None else "procs"
        tree = await start_owned(self.rt, spec, owner, placement)
        key = secrets.token_hex(16)
        if owner is not None and not local:  # a takeover's standby starts it again
            journal_owned(self.rt, tree.label, owner, spec, key)
        return self._serve(tree, spec, owner, key)

    async def resume_subtree(
        self, owner: str, spec: Supervisor | Mesh, key: str, placement: ProcsPlacement
    ) -> None:
        """A takeover's: the subtree `owner` started under the controller it took over from,
        started again in resume mode in `placement` (its adopted processes), with its key."""
        tree = await start_owned(self.rt, spec, owner, placement)
        journal_owned(self.rt, tree.label, owner, spec, key)
        self._serve(tree, spec, owner, key)

    async def resume_singletons(self, placement: ProcsPlacement) -> None:
        """A takeover's: the singletons the controller it took over from ran, started again
        in resume mode in `placement` (their adopted processes), each with its first spec."""
        async with self._singleton_lock:
            root = Supervisor(SINGLETONS, intensity=10, period=10.0)
            self._singletons = await start_owned(self.rt, root, None, placement)
            assert self._singletons.app is not None  # start_owned raises if it did not start
            for child in self._singletons.app.which_children(SINGLETONS):
                if isinstance(child.spec, Worker):
                    self._singleton_specs[child.id] = child.spec

    def _serve(
        self, tree: OwnedTree, spec: Supervisor | Mesh, owner: str | None, key: str
    ) -> dict[str, Any]:
        self.subtrees[key] = tree
        assert self.rt.nursery is not None and tree.app is not None  # start_owned checked both
        self.rt.nursery.start_soon(self._forget, key, tree)
        refs: dict[str, ActorRef | ActorMesh] = {}
        for path, node in walk(spec, owner or ""):
            if isinstance(node, Worker) and not _in_mesh(tree, path):
                refs[path] = tree.app.actor(path)
            elif isinstance(node, Mesh):
                refs[path] = tree.app.mesh(path)
        return {"root": tree.label, "key": key, "refs": refs}

    async def _forget(self, key: str, tree: OwnedTree) -> None:
        # However it ends (its owner's exit, giving up, the owner's request), its key goes:
        # an owner restarted a thousand times leaves no thousand dead trees behind.
        await tree.done.wait()
        self.subtrees.pop(key, None)
        if tree.owner is not None:
            journal_owned_done(self.rt, tree.label)

    async def subtree_stop(self, conn: Connection | None, p: dict[str, Any]) -> None:
        tree = self.subtrees.pop(p.get("key"), None)  # type: ignore[arg-type]
        if tree is None:
            raise MeshError("no such running subtree (already stopped?)")
        self.owners.discard(tree.owner, tree)
        await tree.stop()

    def _tree_with(self, path: Any) -> TreeContext | None:
        seen: set[int] = set()
        for listener in list(self.rt.exit_listeners.values()):
            if isinstance(listener, TreeContext) and id(listener) not in seen:
                seen.add(id(listener))
                holder = listener.holder(path)
                if holder is not None:
                    return holder
        return None

    async def lookup(self, conn: Connection | None, p: dict[str, Any]) -> ActorRef | ActorMesh:
        path = p.get("path")
        if not isinstance(path, str):
            raise MeshError(f"lookup needs a path, not {path!r}")
        holder = self._tree_with(path)
        if holder is not None:
            spec = holder.spec(path)
            if isinstance(spec, Supervisor):
                raise MeshError(f"{path} is a supervisor, not an actor or a mesh")
            if isinstance(spec, Mesh):
                slots = [holder.slot(f"{path}/{rank}") for rank in range(spec.size)]
                return ActorMesh(path, endpoints_of(spec.actor), dict(spec.shape), slots, None)
            return ActorRef(path, endpoints_of(spec.actor), holder.slot(path))
        for mesh in list(self.owners.meshes.values()):
            found: ActorRef | ActorMesh | None = mesh._find(path)
            if found is not None:
                return found
        raise KeyError(f"no actor or mesh at {path!r} in this app")

    async def singleton(self, conn: Connection | None, p: dict[str, Any]) -> ActorRef:
        asked = spec_from_wire(p["spec"])
        if not isinstance(asked, Worker):
            raise MeshError("a singleton is one actor (a Worker spec)")
        path = f"{SINGLETONS}/{asked.id}"
        async with self._singleton_lock:
            bound = self._singleton_specs.get(asked.id)
            # By import path, as both travel (the wire carries no class): a request for
            # another class must not be handed the running actor, nor pass its arguments to it.
            if bound is not None and bound.actor != asked.actor:
                raise SingletonError(
                    f"{path} is a {bound.actor}, not a {asked.actor}: a singleton keeps the "
                    f"class of its first request while the controller runs; ask for "
                    f"{bound.actor}, or give yours another name"
                )
            if self._singletons is None or self._singletons.done.is_set():
                root = Supervisor(SINGLETONS, intensity=10, period=10.0)
                self._singletons = await start_owned(self.rt, root, None)
            app = self._singletons.app
            assert app is not None
            if path not in context(app).specs:
                await app.start_child(SINGLETONS, bound or asked)
                self._singleton_specs[asked.id] = bound or asked
            return app.actor(path)


def _in_mesh(tree: OwnedTree, path: str) -> bool:
    """Whether `path` is one of a Mesh's slot workers (reached through the mesh's ref)."""
    parent = path.rpartition("/")[0]
    assert tree.app is not None
    holder = context(tree.app).holder(parent)
    return holder is not None and isinstance(holder.specs.get(parent), Mesh)


def install(rt: Runtime) -> None:
    rt.service = Service(rt)


_controller_runtime.SERVICES.append(install)
