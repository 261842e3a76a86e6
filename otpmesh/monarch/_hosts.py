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
from .._core._shape import Shape
from .._runtime._controller_runtime import runtime
from ._faults import listen
from ._future import Future, settled
from ._meshes import ActorMesh, NativeProcs, ProcMesh, Ready, to_native
from ._where import run_token, start

A = TypeVar("A")


class HostMesh:
    """The hosts processes are spawned on. ``this_host()`` is the one running this code."""

    __slots__ = ()

    @property
    def extent(self) -> Shape:
        return {}

    @property
    def is_fake_in_process(self) -> bool:
        """False: the processes it spawns are real OS processes (Monarch's in-process fakes are
        not here)."""
        return False

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], None] | None = None,
        name: str | None = None,
    ) -> ProcMesh:
        """Processes on this host, one per point of `per_host` (e.g. ``{"gpus": 4}``)."""
        if bootstrap is not None:
            raise NotImplementedError(
                "spawn_procs(bootstrap=...): otpmesh sends no functions between processes "
                "(it never pickles); run set-up code in the actor's constructor instead"
            )
        return _spawn_procs(dict(per_host) if per_host else {"procs": 1})


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
