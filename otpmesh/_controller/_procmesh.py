"""Proc meshes: shaped sets of worker processes, and spawning actor meshes on them."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from .._core._actor import Actor, class_path
from .._core._errors import ActorError, MeshError, SpawnError
from .._core._exits import ActorCrash, describe
from .._core._reasons import is_normal_exit
from .._core._shape import Shape, all_coords, check_shape
from .._core._signature import Endpoints
from .._core._spec import ONE_FOR_ONE, PERMANENT, Mesh, Restart, Strategy
from .._core._supevents import LogEntry, LogKind
from .._node._mesh import ActorMesh, Slot
from .._runtime._controller_runtime import Proc, Runtime, runtime
from ._app import App, start
from ._events import EventLog
from ._placement import ProcsPlacement, StartError, spawn_on
from ._slotenv import slot_env, visible_gpus

log = logging.getLogger("otpmesh.procmesh")

STOP_TIMEOUT = 5.0


class _Unsupervised:
    """Hears the exits of a proc mesh's unsupervised actors: they go to its event log."""

    def __init__(self, events: EventLog) -> None:
        self._events = events

    def actor_exiting(self, path: str, incarnation: int) -> None:
        return None

    def actor_exited(self, path: str, incarnation: int, reason: object) -> None:
        name, _, rank = path.rpartition("/")
        entry = LogEntry(trio.current_time(), LogKind.CHILD_EXITED, name, rank, incarnation, reason)
        self._events.append(entry)
        if not is_normal_exit(reason):
            log.warning(
                "%s (unsupervised) exited: %s; it will not be restarted", path, describe(reason)
            )

    async def resolve(self, path: str) -> dict[str, Any]:
        return {"gone": f"{path} is not supervised and its process is gone"}


def _crash_error(path: str, reason: object) -> Exception:
    if isinstance(reason, ActorCrash):
        return ActorError(path, reason.type_name, reason.message, reason.traceback)
    return SpawnError(f"{path}: {describe(reason)}")


class ProcMesh:
    """Worker processes, one per point of `shape`. ``async with`` stops them on exit."""

    def __init__(self, rt: Runtime, shape: Shape, procs: list[Proc]) -> None:
        self._rt = rt
        self._shape = shape
        self._procs = procs
        self._meshes: dict[str, ActorMesh] = {}
        self._apps: dict[str, App] = {}
        self._stopping = trio.Event()
        self._groups_running = 0
        self._groups_done = trio.Event()
        #: Exits of this proc mesh's unsupervised actors (supervised ones: ``supervision(name)``).
        self.events = EventLog()

    @property
    def shape(self) -> Shape:
        return dict(self._shape)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __len__(self) -> int:
        return len(self._procs)

    def _check_new(self, name: str, actor: type[Actor]) -> None:
        if not isinstance(name, str) or not name or "/" in name:
            raise MeshError(f"mesh name must be a non-empty string without '/', not {name!r}")
        if name in self._meshes:
            raise MeshError(f"this proc mesh already has an actor mesh named {name!r}")
        if not (isinstance(actor, type) and issubclass(actor, Actor)):
            raise TypeError(f"spawn needs an otpmesh.Actor subclass, not {actor!r}")

    async def spawn(self, name: str, actor: type[Actor], *args: Any, **kwargs: Any) -> ActorMesh:
        """Start one `actor` per process (its constructor runs there, with `args` and `kwargs`);
        return the actor mesh. A failed actor stays dead: its calls fail and ``events`` records
        the exit. For actors that restart, use ``spawn_supervised``."""
        self._check_new(name, actor)
        payload = {
            "cls": class_path(actor),
            "name": name,
            "shape": self._shape,
            "args": list(args),
            "kwargs": kwargs,
        }
        slots = [Slot(f"{name}/{p.rank}", p.addr, p) for p in self._procs]
        errors: dict[int, BaseException] = {}

        async def start_one(proc: Proc, slot: Slot) -> None:
            if proc.conn is None or not proc.alive:
                errors[proc.rank] = SpawnError(f"{slot.actor_id}: {proc.death()}")
                return
            body = dict(
                payload, id=slot.actor_id, rank=proc.rank, coords=proc.coords, incarnation=1
            )
            proc.named(slot.actor_id)
            try:
                await spawn_on(self._rt, proc, body)
            except StartError as exc:  # its constructor or on_start raised
                errors[proc.rank] = _crash_error(slot.actor_id, exc.reason)
            except Exception as exc:
                errors[proc.rank] = exc
            else:
                proc.hosted(slot.actor_id, 1)

        async with trio.open_nursery() as nursery:
            for proc, slot in zip(self._procs, slots, strict=True):
                nursery.start_soon(start_one, proc, slot)
        if errors:
            await self._stop_actors(
                [s for p, s in zip(self._procs, slots, strict=True) if p.rank not in errors]
            )
            rank, first = min(errors.items())
            raise SpawnError(
                f"spawning {name!r} failed on {len(errors)} of {len(slots)} processes; "
                f"rank {rank}: {first}"
            ) from first
        mesh = ActorMesh(name, Endpoints.of(actor.endpoints()), dict(self._shape), slots, None)
        self._meshes[name] = mesh
        for slot in slots:
            self._rt.exit_listeners[slot.actor_id] = _Unsupervised(self.events)
        return mesh

    async def spawn_supervised(
        self,
        name: str,
        actor: type[Actor],
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        strategy: Strategy = ONE_FOR_ONE,
        restart: Restart = PERMANENT,
        intensity: int = 1,
        period: float = 5.0,
    ) -> ActorMesh:
        """Start one `actor` per process as a supervisor group: an OTP supervisor over the
        mesh's actors (``strategy``, ``intensity`` restarts per ``period`` s), the same as a
        ``Mesh`` spec in a tree. The constructor's `args` and `kwargs` are given as such, so no
        actor keyword can be mistaken for a supervision setting. ``supervision(name)`` is the
        group: its events, ``settled()``, dynamic children."""
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
        )
        placement = ProcsPlacement(self._rt, {f"{name}/{p.rank}": p for p in self._procs})
        ready = trio.Event()
        outcome: dict[str, Any] = {}

        async def run_group() -> None:
            # Lives in the runtime's nursery until procs.stop(); a group that gives up only
            # marks its actors gone (their calls fail) and says so in the log.
            self._groups_running += 1
            try:
                async with start(spec, placement=placement) as app:
                    outcome["app"] = app
                    ready.set()
                    await self._stopping.wait()
            except Exception as exc:
                outcome["error"] = exc
                if "app" in outcome:
                    log.error("supervised mesh %s stopped: %s", name, exc)
            finally:
                ready.set()
                self._groups_running -= 1
                if not self._groups_running:
                    self._groups_done.set()

        if self._rt.nursery is None:
            raise SpawnError("the otpmesh runtime is not running")
        self._rt.nursery.start_soon(run_group)
        await ready.wait()
        if "app" not in outcome:
            raise SpawnError(f"spawning supervised mesh {name!r} failed: {outcome.get('error')}")
        app: App = outcome["app"]
        self._apps[name] = app
        mesh = app.mesh(name)
        self._meshes[name] = mesh
        return mesh

    def supervision(self, name: str) -> App:
        """The supervisor group of a mesh spawned with a strategy: its events, dynamic children."""
        try:
            return self._apps[name]
        except KeyError:
            raise MeshError(
                f"{name!r} was not spawned as a supervised mesh on this proc mesh"
            ) from None

    async def _stop_actors(self, slots: list[Slot]) -> None:
        for slot in slots:
            if slot.proc is not None and slot.proc.conn is not None and slot.proc.alive:
                stop = {"id": slot.actor_id, "incarnation": 1, "timeout": STOP_TIMEOUT}
                self._rt.node.sys_cast(slot.proc.conn, "stop_actor", stop)

    async def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every process: ask nicely, then SIGKILL what is still running after `timeout`.
        A process asked nicely stops its actors (``on_stop``), then runs its ``atexit``
        functions and finalizers as a Python program does at exit (for at most 1 s)."""
        self._stopping.set()  # supervised groups stop their actors first, in OTP order
        if self._groups_running:
            with trio.move_on_after(timeout):
                await self._groups_done.wait()
        for proc in self._procs:
            if proc.alive and proc.conn is not None:
                self._rt.node.sys_cast(proc.conn, "shutdown", None)
        with trio.move_on_after(timeout):
            for proc in self._procs:
                await proc.exited.wait()
        for proc in self._procs:
            self._rt.kill(proc)
        with trio.move_on_after(timeout):
            for proc in self._procs:
                await proc.exited.wait()

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with trio.CancelScope(shield=True):
            await self.stop()

    def __repr__(self) -> str:
        return f"ProcMesh({self._shape})"


async def proc_mesh(**shape: int) -> ProcMesh:
    """Start one worker process per point of `shape` (e.g. ``procs=4``, ``hosts=2, gpus=4``)."""
    checked = check_shape(shape)
    rt = await runtime()
    coords = all_coords(checked)
    gpus = visible_gpus()
    envs = [slot_env(point, rank, gpus) for rank, point in enumerate(coords)]
    procs = await rt.start_procs(checked, coords, envs)
    return ProcMesh(rt, checked, procs)
