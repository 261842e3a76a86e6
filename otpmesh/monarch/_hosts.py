"""Monarch's hosts: ``this_host()`` (a ``HostMesh`` whose ``spawn_procs`` starts processes),
``this_proc()``, and ``get_or_spawn_controller`` (the app's one actor of a name)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from .._controller._owned import singleton
from .._controller._procmesh import ProcMesh as NativeProcMesh
from .._controller._procmesh import proc_mesh
from .._core._shape import Shape, select
from .._runtime._controller_runtime import runtime
from ._faults import listen
from ._future import Future, settled
from ._meshes import ActorMesh, NativeProcs, ProcMesh, Ready, extent_size, to_native
from ._values import Extent
from ._where import in_trio, run_token, start

A = TypeVar("A")


class HostMesh:
    """The hosts processes are spawned on: ``this_host()`` (the one running this code), or a
    job's (``otpmesh.monarch.job``), whose extent is ``{"hosts": n}``. ``spawn_procs`` gives a
    proc mesh of the host extent and `per_host` together (``{"hosts": 2, "gpus": 4}``)."""

    __slots__ = ("_extent", "_hosts")

    def __init__(self, extent: Shape | None = None) -> None:
        self._extent: Shape = dict(extent or {})
        # What this mesh and its slices share: the proc meshes spawned on them, shut down or not.
        self._hosts = _Hosts(owned=False)

    @classmethod
    def _sharing(cls, extent: Shape, hosts: _Hosts) -> HostMesh:
        mesh = cls(extent)
        mesh._hosts = hosts
        return mesh

    @property
    def extent(self) -> Extent:
        return Extent.of(self._extent)

    def size(self, dim: str | None = None) -> int:
        """How many hosts, or the size along `dim`."""
        return extent_size(self._extent, dim)

    @property
    def is_fake_in_process(self) -> bool:
        """False: the processes it spawns are real OS processes (Monarch's in-process fakes are
        not here)."""
        return False

    @property
    def initialized(self) -> Future[bool]:
        """Resolves once the hosts are up (here at once: a job's hosts are up when it returns
        them)."""
        return settled(True)

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], None] | None = None,
        name: str | None = None,
    ) -> ProcMesh:
        """Processes on these hosts, one per point of the hosts' extent and `per_host`
        together (e.g. ``{"gpus": 4}``)."""
        if bootstrap is not None:
            raise NotImplementedError(
                "spawn_procs(bootstrap=...): otpmesh sends no functions between processes "
                "(it never pickles); run set-up code in the actor's constructor instead"
            )
        self._hosts.check_up()
        extent = {**self._extent, **(per_host or {})}
        procs = _spawn_procs(extent or {"procs": 1})
        if self._hosts.tracked:  # a job's hosts (this_host()'s are the program's, kept by it)
            self._hosts.spawned.append(procs)
        return procs

    def slice(self, **selection: int | slice) -> HostMesh:
        """Some of the hosts: ``hosts=0`` drops the dimension, ``hosts=slice(0, 2)`` keeps
        part. A slice refers to its mesh's hosts: it cannot shut them down."""
        extent, _ = select(self._extent, **selection)
        return HostMesh._sharing(extent, self._hosts.reference())

    def stop(self) -> Future[None]:
        """Stop every process spawned on these hosts; the hosts stay, to spawn on again."""
        return start(self._hosts.stop_procs)

    def shutdown(self) -> Future[None]:
        """Stop every process spawned on these hosts, and the hosts: a later ``spawn_procs``
        or ``shutdown`` raises RuntimeError."""
        self._hosts.check_owned()
        self._hosts.check_up()
        self._hosts.down = True
        return start(self._hosts.stop_procs)

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def __repr__(self) -> str:
        return f"<monarch HostMesh, extent {self._extent}>"


class _Hosts:
    """The state a host mesh and its slices share."""

    __slots__ = ("down", "owned", "spawned", "tracked")

    def __init__(self, *, owned: bool, spawned: list[ProcMesh] | None = None) -> None:
        self.owned = owned  # a job's mesh, which may be shut down; not a slice, not this_host()
        self.tracked = owned or spawned is not None  # a job's mesh or a slice of one
        self.down = False
        self.spawned: list[ProcMesh] = spawned if spawned is not None else []

    def reference(self) -> _Hosts:
        return _Hosts(owned=False, spawned=self.spawned if self.tracked else None)

    def check_up(self) -> None:
        if self.down:
            raise RuntimeError(
                "HostMesh has already been shut down: get a new one from the job "
                "(job.state().NAME) to spawn processes again"
            )

    def check_owned(self) -> None:
        if not self.owned:
            raise RuntimeError(
                "cannot shut down `HostMesh` that is a reference instead of owned: shut down "
                "the job's mesh it was sliced from (or call job.kill())"
            )

    async def stop_procs(self, ready: Ready) -> None:
        ready()
        spawned, self.spawned[:] = list(self.spawned), []
        for procs in spawned:
            try:
                native = await to_native(procs)
            except Exception:
                continue  # it never started: nothing to stop
            if isinstance(native, NativeProcMesh):
                await native.stop_unless_stopped()
            else:
                await native.stop()


def job_hosts(hosts: int) -> HostMesh:
    """A job's `hosts` hosts (``{"hosts": n}`` of this machine): it may shut them down."""
    return HostMesh._sharing({"hosts": hosts}, _Hosts(owned=True))


def kill(hosts: HostMesh) -> None:
    """A job's kill: shut `hosts` down unless shut down, waiting for the processes to stop (in
    trio code, where nothing may block, they stop in the background)."""
    state = hosts._hosts
    if state.down:
        return
    state.down = True
    stopped = start(state.stop_procs)
    if not in_trio():
        stopped.get()


def _spawn_procs(extent: Shape, token: trio.lowlevel.TrioToken | None = None) -> ProcMesh:
    async def spawn_procs(ready: Ready) -> NativeProcs:
        ready()
        procs = await proc_mesh(**extent)
        if isinstance(procs, NativeProcMesh):  # the program's own: nobody owns its meshes
            listen(await runtime())
        return procs

    return ProcMesh(start(spawn_procs, token=token), extent)


_this_host = HostMesh()
#: this_proc()'s mesh, per trio run (a test's run, the client runtime, a worker's).
_this_procs: weakref.WeakKeyDictionary[trio.lowlevel.TrioToken, ProcMesh] = (
    weakref.WeakKeyDictionary()
)
# Threads of one script (or a blocking endpoint beside the trio thread) may ask at once: one
# process is started, never two.
_this_procs_lock = threading.Lock()


def this_host() -> HostMesh:
    """The host running this code."""
    return _this_host


def this_proc() -> ProcMesh:
    """A one-process mesh to spawn actors on. Unlike Monarch, not this very process: otpmesh
    runs actors in processes of their own, so it is one process started on first use."""
    token = run_token()  # outside the lock: from a worker thread it waits for the trio thread
    with _this_procs_lock:
        procs = _this_procs.get(token)
        if procs is None:
            procs = _this_procs[token] = _spawn_procs({"procs": 1}, token)
    return procs


def get_or_spawn_controller(name: str, actor: type[A], *args: Any, **kwargs: Any) -> Future[Any]:
    """The app's one actor called `name`, spawned on first use with ``actor(*args, **kwargs)``
    (later calls get the same one); supervised, restarted if it crashes."""

    async def get(ready: Ready) -> ActorMesh[A]:
        ready()
        ref = await singleton(name, actor, *await to_native(args), **await to_native(kwargs))
        return ActorMesh(settled(ref), actor, {})

    return start(get)
