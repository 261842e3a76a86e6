"""Proc meshes: shaped sets of worker processes, and spawning actor meshes on them."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, ClassVar

import trio

from .._core._actor import Actor, class_path, current_path
from .._core._errors import ActorError, MeshError, SpawnError
from .._core._exits import ActorCrash, describe
from .._core._shape import Shape, all_coords, check_shape, select
from .._core._spec import ONE_FOR_ONE, PERMANENT, START_TIMEOUT, Mesh, Restart, Strategy
from .._node._ask import ask_controller
from .._node._daemon import current as current_daemon
from .._node._future import Future, later
from .._node._mesh import ActorMesh, ActorRef, Slot
from .._runtime import _run
from .._runtime._controller_runtime import Runtime, runtime
from .._runtime._proc import Proc
from .._wire import _codec
from ._app import App, endpoints_of
from ._events import EventLog
from ._hook import Unsupervised
from ._owners import STOP_TIMEOUT, owners
from ._placement import ProcsPlacement, StartError, spawn_on
from ._procref import ProcMeshRef
from ._slotenv import otpmesh_settings, slot_env, visible_gpus
from ._subtree import OwnedTree, start_owned

log = logging.getLogger("otpmesh.procmesh")


def _crash_error(path: str, reason: object) -> Exception:
    if isinstance(reason, ActorCrash):
        return ActorError(path, reason.type_name, reason.message, reason.traceback)
    return SpawnError(f"{path}: {describe(reason)}")


class ProcMesh:
    """Worker processes, one per point of `shape`. ``async with`` stops them on exit.

    Made from inside an actor, the processes belong to that actor (its `owner`): its meshes'
    actors live under its path, and they are stopped when it exits. A proc mesh can be sent in
    a message (a handle: ``otpmesh.ProcMeshRef``) and sliced."""

    _wire_ext: ClassVar[int] = _codec.EXT_PROC_MESH  # travels as a handle (_procref.py)

    def __init__(
        self, rt: Runtime, shape: Shape, procs: list[Proc], owner: str | None = None
    ) -> None:
        self._rt = rt
        self._shape = shape
        self._procs = procs
        self._meshes: dict[str, ActorMesh] = {}
        self._apps: dict[str, OwnedTree] = {}
        self._views: dict[tuple[Any, ...], ProcMesh] = {}
        self._spawners: dict[str, Proc | None] = {}  # which process asked for each actor mesh
        # Which actor hears of each actor mesh's failures (``__supervise__``), where it is not
        # this proc mesh's owner: the actor that spawned it on these processes (Monarch's rule).
        self._hearers: dict[str, str] = {}
        self._listeners: dict[str, Unsupervised] = {}  # unsupervised actor meshes' exit listeners
        self._stopping = trio.Event()
        self.owner = owner
        registry = owners(rt)
        self.id = registry.new_id()
        self.label = f"proc mesh {self.id}" + (f" of {owner}" if owner else "")
        registry.meshes[self.id] = self
        registry.add(owner, self)
        #: Exits of this proc mesh's unsupervised actors (supervised ones: ``supervision(name)``).
        self.events = EventLog()

    def _to_wire(self) -> list[Any]:
        return [self.id, list(self._shape.items()), self.pids, None]

    @property
    def shape(self) -> Shape:
        return dict(self._shape)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __len__(self) -> int:
        return len(self._procs)

    def slice(self, **selection: int | slice) -> ProcMesh:
        """A proc mesh over some of these processes (``hosts=0``, ``gpus=slice(0, 2)``): spawn
        on it, stop it (those processes only), send it. It has the same owner."""
        shape, ranks = select(self._shape, **selection)
        return self._subset(ranks, shape)

    def _subset(self, ranks: list[int], shape: Shape) -> ProcMesh:
        """The slice of these processes at `ranks`, shaped `shape` (a handle's slice: made once
        per distinct slice, then reused)."""
        if len(ranks) != len(all_coords(shape)):
            raise MeshError(f"a slice of shape {shape} cannot hold {len(ranks)} processes")
        key = (tuple(ranks), tuple(shape.items()))
        view = self._views.get(key)
        if view is None or view.stopped:
            view = self._views[key] = ProcMesh(
                self._rt, shape, [self._procs[r] for r in ranks], self.owner
            )
        return view

    def _find(self, path: str) -> ActorMesh | ActorRef | None:
        """This proc mesh's actor mesh at `path`, or one actor of it, if it has it."""
        for mesh in self._meshes.values():
            if mesh.name == path:
                return mesh
            if path.startswith(mesh.name + "/") and path in mesh.paths:
                return mesh[mesh.paths.index(path)]
        return None

    def _may_stop(self, name: str, asker: Proc) -> bool:
        """Whether the worker `asker` may stop the actor mesh `name`: it hosts this proc mesh's
        owner, or it asked for the mesh."""
        owner_there = self.owner is not None and self.owner in asker.names
        return owner_there or self._spawners.get(name) is asker

    def _stopped_on_purpose(self, name: str) -> bool:
        return self.stopped or name not in self._meshes

    def _path(self, name: str) -> str:
        return f"{self.owner}/{name}" if self.owner else name

    def _check_new(self, name: str, actor: type[Actor] | str) -> None:
        if not isinstance(name, str) or not name or "/" in name:
            raise MeshError(f"mesh name must be a non-empty string without '/', not {name!r}")
        if name in self._meshes:
            raise MeshError(f"this proc mesh already has an actor mesh named {name!r}")
        if self._stopping.is_set():
            raise MeshError(f"{self.label} is stopped: start another with otpmesh.proc_mesh()")
        if isinstance(actor, str):
            return  # an import path, from a process that had the class (checked where it runs)
        if not (isinstance(actor, type) and issubclass(actor, Actor)):
            raise TypeError(f"spawn needs an otpmesh.Actor subclass, not {actor!r}")

    def spawn(
        self, name: str, actor: type[Actor] | str, *args: Any, **kwargs: Any
    ) -> Future[ActorMesh]:
        """Start one `actor` per process (its constructor runs there, with `args` and `kwargs`);
        the actor mesh (a Future: await it, or ``.get()`` from sync code). A failed actor stays
        dead: its calls fail, ``events`` records the exit, and an owner hears of it
        (``__supervise__``). For actors that restart, use ``spawn_supervised``. A start that
        takes more than ``START_TIMEOUT`` (600 s) fails as hung, with its stack (for another
        limit, ``spawn_supervised(..., start_timeout=...)``)."""
        self._check_new(name, actor)
        return later(f"spawning {name!r}", self._spawn, name, actor, args, kwargs)

    async def _spawn(
        self, name: str, actor: type[Actor] | str, args: Any, kwargs: Any
    ) -> ActorMesh:
        self._check_new(name, actor)
        path = self._path(name)
        coords = all_coords(self._shape)
        payload = {
            "cls": actor if isinstance(actor, str) else class_path(actor),
            "name": name,
            "shape": self._shape,
            "args": list(args),
            "kwargs": kwargs,
            "start_timeout": START_TIMEOUT,
            "supervised": False,  # nothing restarts it: the default error policy says so
        }
        slots = [Slot(f"{path}/{rank}", p.addr, p) for rank, p in enumerate(self._procs)]
        errors: dict[int, BaseException] = {}

        async def start_one(rank: int, proc: Proc, slot: Slot) -> None:
            if proc.conn is None or not proc.alive:
                errors[rank] = SpawnError(f"{slot.actor_id}: {proc.death()}")
                return
            body = dict(payload, id=slot.actor_id, rank=rank, coords=coords[rank], incarnation=1)
            proc.named(slot.actor_id)
            try:
                await spawn_on(self._rt, proc, body)
            except StartError as exc:  # its constructor or on_start raised
                errors[rank] = _crash_error(slot.actor_id, exc.reason)
            except Exception as exc:
                errors[rank] = exc
            else:
                proc.hosted(slot.actor_id, 1)

        listener = Unsupervised(
            self._rt,
            self.events,
            path,
            self._hearers.get(name, self.owner),
            partial(self._stopped_on_purpose, name),
        )
        for slot in slots:
            self._rt.exit_listeners[slot.actor_id] = listener
        self._listeners[name] = listener
        async with trio.open_nursery() as nursery:
            for rank, (proc, slot) in enumerate(zip(self._procs, slots, strict=True)):
                nursery.start_soon(start_one, rank, proc, slot)
        if errors:
            await self._stop_actors([s for r, s in enumerate(slots) if r not in errors])
            self._forget(name, slots)
            rank, first = min(errors.items())
            raise SpawnError(
                f"spawning {name!r} failed on {len(errors)} of {len(slots)} processes; "
                f"rank {rank}: {first}",
                failed=dict(sorted(errors.items())),
            ) from first
        mesh = ActorMesh(path, endpoints_of(actor), dict(self._shape), slots, None)
        self._meshes[name] = mesh
        return mesh

    def spawn_supervised(
        self,
        name: str,
        actor: type[Actor] | str,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        strategy: Strategy = ONE_FOR_ONE,
        restart: Restart = PERMANENT,
        intensity: int = 1,
        period: float = 5.0,
        start_timeout: float | None = START_TIMEOUT,
    ) -> Future[ActorMesh]:
        """Start one `actor` per process as a supervisor group: an OTP supervisor over the
        mesh's actors (``strategy``, ``intensity`` restarts per ``period`` s; each start within
        ``start_timeout`` s), the same as a ``Mesh`` spec in a tree. The constructor's `args`
        and `kwargs` are given as such, so no actor keyword can be mistaken for a supervision
        setting. ``supervision(name)`` is the
        group: its events, ``settled()``, dynamic children. A group that gives up crashes its
        owner (an actor that made this proc mesh), whose own supervisor then decides. A Future:
        await it, or ``.get()`` from sync code."""
        self._check_new(name, actor)
        spec = Mesh(
            name,
            actor,
            shape=self._shape,
            args=tuple(args),
            kwargs=dict(kwargs or {}),
            strategy=strategy,
            restart=restart,
            intensity=intensity,
            period=period,
            start_timeout=start_timeout,
        )
        return later(f"spawning {name!r}", self._spawn_supervised, name, spec)

    async def _spawn_supervised(self, name: str, spec: Mesh) -> ActorMesh:
        self._check_new(name, spec.actor)
        path = self._path(name)
        placement = ProcsPlacement(
            self._rt, {f"{path}/{rank}": p for rank, p in enumerate(self._procs)}
        )
        tree = await start_owned(self._rt, spec, self.owner, placement)
        owners(self._rt).discard(self.owner, tree)  # stopped with these processes, in order
        self._apps[name] = tree
        assert tree.app is not None
        mesh = tree.app.mesh(path)
        self._meshes[name] = mesh
        return mesh

    def supervision(self, name: str) -> App:
        """The supervisor group of a mesh spawned with a strategy: its events, dynamic children."""
        tree = self._apps.get(name)
        if tree is None or tree.app is None:
            raise MeshError(f"{name!r} was not spawned as a supervised mesh on this proc mesh")
        return tree.app

    async def _stop_mesh(self, name: str, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the actors of the mesh `name` (their ``on_stop`` runs); the processes stay."""
        tree = self._apps.pop(name, None)
        mesh = self._meshes.pop(name, None)
        if tree is not None:
            await tree.stop(timeout)
        elif mesh is not None:
            await self._stop_actors(mesh._slots, timeout, wait=True)
            self._forget(name, mesh._slots)
        else:
            raise MeshError(f"this proc mesh has no actor mesh named {name!r}")

    def _forget(self, name: str, slots: list[Slot]) -> None:
        """Drop the exit listener of the unsupervised actor mesh `name`, once its actors are
        stopped: a controller that spawns and stops meshes for days keeps none of them."""
        self._hearers.pop(name, None)
        listener = self._listeners.pop(name, None)
        if listener is None:
            return  # a supervised mesh: its tree's listeners go with the tree
        for slot in slots:
            if self._rt.exit_listeners.get(slot.actor_id) is listener:
                del self._rt.exit_listeners[slot.actor_id]

    def _mesh_named(self, path: str) -> str | None:
        """The name of this proc mesh's actor mesh whose path is `path`, if it has one."""
        return next((n for n, m in self._meshes.items() if m.name == path), None)

    async def _stop_actors(
        self, slots: list[Slot], timeout: float = STOP_TIMEOUT, wait: bool = False
    ) -> None:
        async def stop_one(slot: Slot) -> None:
            proc = slot.proc
            if proc is None or proc.conn is None or not proc.alive:
                return
            stop = {"id": slot.actor_id, "incarnation": 1, "timeout": timeout}
            if not wait:
                self._rt.node.sys_cast(proc.conn, "stop_actor", stop)
                return
            with trio.move_on_after(timeout + 1.0):
                try:
                    await self._rt.node.sys_call(proc.conn, "stop_actor", stop, slot.actor_id)
                except Exception:
                    pass  # its process went: the actor is stopped either way

        async with trio.open_nursery() as nursery:
            for slot in slots:
                nursery.start_soon(stop_one, slot)

    def stop(self, timeout: float = STOP_TIMEOUT) -> Future[None]:
        """Stop every process: ask nicely, then SIGKILL what is still running after `timeout`.
        Supervised groups stop their actors first, in OTP order; a process asked nicely stops
        its actors (``on_stop``), then runs its ``atexit`` functions and finalizers as a Python
        program does at exit (for at most 1 s). A Future: await it, or ``.get()``."""
        return later(f"stopping {self.label}", self._stop, timeout)

    async def _stop(self, timeout: float) -> None:
        if self._stopping.is_set():
            raise MeshError(f"{self.label} is already stopped")
        self._stopping.set()
        registry = owners(self._rt)
        registry.meshes.pop(self.id, None)
        registry.discard(self.owner, self)
        async with trio.open_nursery() as nursery:
            for tree in self._apps.values():
                nursery.start_soon(tree.stop, timeout)
        for proc in self._procs:
            self._rt.shutdown(proc, None)
        with trio.move_on_after(timeout):
            for proc in self._procs:
                await proc.exited.wait()
        for proc in self._procs:
            self._rt.kill(proc)
        with trio.move_on_after(timeout):
            for proc in self._procs:
                await proc.exited.wait()
        for mesh in [self, *self._views.values()]:  # their processes are gone: so are their actors
            for name, actors in list(mesh._meshes.items()):
                mesh._forget(name, actors._slots)

    @property
    def stopped(self) -> bool:
        return self._stopping.is_set()

    async def stop_unless_stopped(self, timeout: float = STOP_TIMEOUT) -> None:
        if not self.stopped:
            await self._stop(timeout)

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with trio.CancelScope(shield=True):
            await self.stop_unless_stopped()

    def __repr__(self) -> str:
        return f"ProcMesh({self._shape})"


def proc_mesh(**shape: int) -> Future[ProcMesh | ProcMeshRef]:
    """Start one worker process per point of `shape` (e.g. ``procs=4``, ``hosts=2, gpus=4``).
    A Future: ``await`` it (trio, asyncio), or ``.get()`` it from sync code, where the first
    use starts otpmesh's background run (docs/guides/calling.md, "From sync code").

    Inside an actor (in any process of the app) the controller starts them for that actor,
    which owns them: they are stopped when it exits. The result is then a ``ProcMeshRef``."""
    checked = check_shape(shape)
    return later(f"otpmesh.proc_mesh({_shape_words(checked)})", _proc_mesh, checked)


def _shape_words(shape: Shape) -> str:
    return ", ".join(f"{name}={size}" for name, size in shape.items())


async def _proc_mesh(checked: Shape) -> ProcMesh | ProcMeshRef:
    owner = current_path()
    if _run.IN_WORKER:  # a worker's actor: the controller starts them, for it
        found: ProcMeshRef = await ask_controller("procs_start", {"shape": checked, "owner": owner})
        return found
    rt = await runtime()
    procs = await start_procs(rt, checked, owner)
    background = current_daemon()
    if background is not None:  # a sync script's: stopped in order at exit if it did not
        background.at_stop(procs.stop_unless_stopped)
    return procs


async def start_procs(rt: Runtime, shape: Shape, owner: str | None) -> ProcMesh:
    """Fork the processes of a proc mesh of `shape`, owned by the actor at `owner`."""
    coords = all_coords(shape)
    gpus = visible_gpus()
    settings = otpmesh_settings()
    envs = [slot_env(point, rank, gpus, settings) for rank, point in enumerate(coords)]
    procs = await rt.start_procs(shape, coords, envs)
    return ProcMesh(rt, shape, procs, owner)
