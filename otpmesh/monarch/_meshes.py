"""Monarch's meshes over otpmesh's: ``ProcMesh``, ``ActorMesh`` and the endpoint adverbs
(``call``, ``call_one``, ``choose``, ``stream``, ``broadcast``).

Each Monarch mesh holds a Future of the otpmesh mesh it stands for: ``spawn`` returns at once
(as Monarch's does) and the calls made before the actors are up wait for them, in order.
What travels between processes is always the otpmesh object (``to_native``); what Monarch
code receives is wrapped again (``to_monarch``), so a mesh passed to an actor is used there
with Monarch's adverbs too.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import aclosing
from typing import Any, Generic, TypeVar

from .._controller._procmesh import ProcMesh as NativeProcMesh
from .._controller._procref import ProcMeshRef
from .._core._actor import Actor as NativeActor
from .._core._errors import ActorDiedError, ActorError, MeshError, SpawnError
from .._core._shape import Shape, select
from .._core._valuemesh import ValueMesh as NativeValueMesh
from .._node._failure import MeshFailure
from .._node._mesh import ActorMesh as NativeActorMesh
from .._node._mesh import ActorRef
from .._node._ports import Port as NativePort
from ._faults import report
from ._future import Future, settled
from ._supervision import as_monarch
from ._syncthread import check_styles
from ._values import Extent, ValueMesh
from ._where import start

log = logging.getLogger("otpmesh.monarch")

A = TypeVar("A")
R = TypeVar("R")
NativeMesh = NativeActorMesh | ActorRef
NativeProcs = NativeProcMesh | ProcMeshRef
Ready = Callable[[], None]


def extent_size(extent: Shape, dim: str | None = None) -> int:
    """The number of points of `extent`, or its size along `dim`."""
    if dim is not None:
        if dim not in extent:
            raise KeyError(f"no dimension {dim!r} in extent {extent}")
        return extent[dim]
    size = 1
    for n in extent.values():
        size *= n
    return size


class ActorMesh(Generic[A]):
    """Actors of one class, one per point of its proc mesh; ``mesh.ep`` is an endpoint with
    Monarch's adverbs. Index with ``slice(dim=i)``."""

    __slots__ = ("_cls", "_extent", "_native")

    def __init__(self, native: Future[NativeMesh], cls: type | None, extent: Shape) -> None:
        self._native = native
        self._cls = cls
        self._extent = dict(extent)

    @classmethod
    def _of(cls, native: NativeMesh) -> ActorMesh[Any]:
        extent = native.shape if isinstance(native, NativeActorMesh) else {}
        return ActorMesh(settled(native), None, extent)

    @classmethod
    def from_otpmesh(cls, mesh: NativeMesh) -> ActorMesh[Any]:
        """Monarch's view of an otpmesh mesh or actor: e.g. a declared tree's
        (``app.mesh("rl/rollouts")``), whose actors its supervisor restarts."""
        if not isinstance(mesh, NativeActorMesh | ActorRef):
            raise TypeError(f"from_otpmesh needs an otpmesh ActorMesh or ActorRef, not {mesh!r}")
        return cls._of(mesh)

    async def _resolved(self) -> NativeMesh:
        return await self._native

    @property
    def extent(self) -> Extent:
        return Extent.of(self._extent)

    def size(self, dim: str | None = None) -> int:
        """How many points (actors, processes), or the size along `dim`."""
        return extent_size(self._extent, dim)

    def __len__(self) -> int:
        return extent_size(self._extent)

    def __getattr__(self, name: str) -> Endpoint[Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        cls = self._cls
        if cls is not None and name not in _endpoint_names(cls):
            raise AttributeError(
                f"{cls.__qualname__} has no endpoint {name!r} (endpoints: "
                f"{', '.join(sorted(_endpoint_names(cls))) or 'none'})"
            )
        return Endpoint(self, name)

    def slice(self, **selection: int | slice) -> ActorMesh[A]:
        """Part of the mesh: ``gpus=0`` drops the dimension, ``gpus=slice(0, 2)`` keeps part."""
        extent, _ = select(self._extent, **selection)  # checked here, at once

        async def sliced(ready: Ready) -> NativeMesh:
            ready()
            native = await self._native
            if not isinstance(native, NativeActorMesh):
                return native
            return native.slice(**selection)

        return ActorMesh(start(sliced), self._cls, extent)

    def flatten(self, name: str) -> ActorMesh[A]:
        """The same actors along one dimension `name`, in rank order."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"flatten(name): name must be a dimension's name, not {name!r}")

        async def flattened(ready: Ready) -> NativeMesh:
            ready()
            native = await self._native
            return native.flatten(name) if isinstance(native, NativeActorMesh) else native

        return ActorMesh(start(flattened), self._cls, {name: extent_size(self._extent)})

    @property
    def initialized(self) -> Future[bool]:
        """Resolves once the actors are up (a failed spawn raises here)."""
        return _once_up(self._native)

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop these actors (each runs ``__cleanup__``); their processes stay."""

        async def stop(ready: Ready) -> None:
            native = await self._native
            ready()
            if isinstance(native, NativeActorMesh):
                await native.stop()
            else:
                raise ValueError(f"{native!r} is one actor of a tree: its supervisor stops it")

        return start(stop)

    def __repr__(self) -> str:
        name = self._cls.__qualname__ if self._cls is not None else "?"
        return f"<monarch ActorMesh of {name}, extent {self._extent}>"


@functools.cache
def _endpoint_names(cls: type) -> frozenset[str]:
    """The endpoints of actor class `cls` (classes do not change once defined)."""
    found = getattr(cls, "endpoints", None)
    return frozenset(found() if callable(found) else ())


class Endpoint(Generic[R]):
    """One endpoint of an actor mesh, with Monarch's adverbs. Every adverb sends at once."""

    __slots__ = ("_mesh", "_name")

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh, self._name = mesh, name

    async def _prepare(
        self, ready: Ready, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        """The otpmesh endpoint and arguments, once the mesh is up; then this call may go."""
        ep = (await self._mesh._resolved()).endpoint(self._name)
        if _holds_monarch(args) or _holds_monarch(kwargs):
            args, kwargs = await to_native(args), await to_native(kwargs)
        ready()
        return ep, args, kwargs

    @staticmethod
    def _label(ep: Any) -> str:
        """How Monarch names this call in its errors: ``mesh.endpoint()`` (otpmesh's endpoints
        print as ``mesh.endpoint``)."""
        return f"{ep!r}()"

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Call every actor; the Future's value is a ValueMesh of their results."""

        async def call(ready: Ready) -> ValueMesh[R]:
            ep, a, k = await self._prepare(ready, args, kwargs)
            values: NativeValueMesh[Any] = await _monarch_errors(
                ep.call(*a, **k), Endpoint._label(ep)
            )
            return ValueMesh(values.shape, [to_monarch(v) for v in values.values()])

        return start(call)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the one actor of this mesh (a slice to one point, or a one-actor mesh)."""

        async def call_one(ready: Ready) -> R:
            ep, a, k = await self._prepare(ready, args, kwargs)
            return to_monarch(await _monarch_errors(ep.call_one(*a, **k), Endpoint._label(ep)))  # type: ignore[no-any-return]

        return start(call_one)

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one actor of the mesh, the least busy one."""

        async def choose(ready: Ready) -> R:
            ep, a, k = await self._prepare(ready, args, kwargs)
            return to_monarch(await _monarch_errors(ep.choose(*a, **k), Endpoint._label(ep)))  # type: ignore[no-any-return]

        return start(choose)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Call every actor; one Future per actor, the k-th holding the k-th reply to arrive."""
        # Made before the driver starts: it may run (on the trio run's thread) at once.
        futures: list[Future[R]] = [Future(0) for _ in range(self._mesh.size())]

        async def stream(ready: Ready) -> None:
            for future in futures:
                future.owned_by(threading.get_ident())
            ep, a, k = await self._prepare(ready, args, kwargs)
            index = 0
            try:
                async with aclosing(ep.stream(*a, **k)) as replies:
                    async for _coords, value in replies:
                        futures[index]._settle(to_monarch(value), None)
                        index += 1
            except BaseException as exc:
                for future in futures[index:]:
                    future._settle(None, as_monarch(exc))
                raise

        driver = start(stream)
        if driver.owner:  # started from that run's thread: known now (get() there refused)
            for future in futures:
                future.owned_by(driver.owner)
        return iter(futures)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor without waiting (FIFO with later messages from this sender)."""

        async def broadcast(ready: Ready) -> None:
            ep, a, k = await self._prepare(ready, args, kwargs)
            await ep.broadcast(*a, **k)

        future = start(broadcast)
        future._on_done(lambda: _log_failure(future, self._name))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"an endpoint is not called directly: use .call(...), .call_one(...), "
            f".choose(...), .stream(...) or .broadcast(...) on {self._name}"
        )


async def _monarch_errors(call: Awaitable[R], label: str) -> R:
    """`call`'s result; its error as Monarch code sees it (a dead actor: SupervisionError,
    which names the call `label` as Monarch's does: "Endpoint call mesh.ep() failed, ...")."""
    try:
        return await call
    except (ActorDiedError, ActorError) as exc:
        converted = as_monarch(exc, call=label)
        if converted is exc:
            raise
        raise converted from exc


def _once_up(native: Future[Any]) -> Future[bool]:
    """True once `native` (a mesh being made) is made; its error if it failed."""

    async def up(ready: Ready) -> bool:
        ready()
        await native
        return True

    return start(up)


def _log_failure(future: Future[None], name: str) -> None:
    try:
        future.get(0)
    except Exception as exc:
        log.warning("broadcast of %s failed: %s", name, exc)


def _spawn_failures(name: str, error: SpawnError) -> list[MeshFailure]:
    """The failures of mesh `name`'s spawn, one per rank that failed, as Monarch reports them;
    one for the whole mesh (rank -1) when no rank was tried."""
    failures = []
    for rank, cause in error.failed.items():
        actor = cause.actor if isinstance(cause, ActorError | ActorDiedError) else f"{name}/{rank}"
        failures.append(MeshFailure(name, actor, rank, f"spawning {name!r} failed: {cause}"))
    return failures or [MeshFailure(name, name, -1, str(error))]


def _stopped_error(name: str) -> RuntimeError:
    return RuntimeError(
        f"spawn({name!r}, ...): `ProcMesh` has already been stopped; spawn on a new one "
        "(host.spawn_procs(...))"
    )


class ProcMesh:
    """Processes, one per point of its extent; ``spawn`` starts actors on them."""

    __slots__ = ("_extent", "_native", "_stopped")

    def __init__(self, native: Future[NativeProcs], extent: Shape) -> None:
        self._native = native
        self._extent = dict(extent)
        self._stopped = False  # stop() was asked for: spawn is refused, as Monarch's is

    @classmethod
    def from_otpmesh(cls, procs: NativeProcs) -> ProcMesh:
        """Monarch's view of an otpmesh proc mesh (``await otpmesh.proc_mesh(...)``)."""
        if not isinstance(procs, NativeProcMesh | ProcMeshRef):
            raise TypeError(f"from_otpmesh needs an otpmesh ProcMesh, not {procs!r}")
        return cls(settled(procs), procs.shape)

    @property
    def extent(self) -> Extent:
        return Extent.of(self._extent)

    def size(self, dim: str | None = None) -> int:
        """How many points (actors, processes), or the size along `dim`."""
        return extent_size(self._extent, dim)

    def spawn(self, name: str, actor: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """One `actor` per process (``actor(*args, **kwargs)`` runs there); returns at once,
        calls made before the actors are up wait for them."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"spawn(name, actor_class, ...): name must be a string, not {name!r}")
        if not isinstance(actor, type) or not issubclass(actor, NativeActor):
            raise TypeError(
                f"spawn({name!r}, actor_class, ...): {actor!r} is not an Actor class "
                "(subclass otpmesh.monarch.Actor)"
            )
        check_styles(actor)
        if self._stopped:
            raise _stopped_error(name)
        cls: type[NativeActor] = actor

        async def spawn(ready: Ready) -> NativeMesh:
            procs = await self._native
            a, k = await to_native(args), await to_native(kwargs)
            ready()
            try:
                mesh: NativeMesh = await procs.spawn(name, cls, *a, **k)
            except MeshError as exc:
                if isinstance(procs, NativeProcMesh) and procs.stopped:
                    raise _stopped_error(name) from exc
                raise
            except SpawnError as exc:
                # The program's own proc mesh: nobody else to tell. One it stopped meanwhile
                # ended the spawn on purpose: the spawn's error, no fault.
                if isinstance(procs, NativeProcMesh) and not procs.stopped:
                    for failure in _spawn_failures(name, exc):
                        report(failure)
                raise
            return mesh

        return ActorMesh(start(spawn), actor, self._extent)

    def slice(self, **selection: int | slice) -> ProcMesh:
        extent, _ = select(self._extent, **selection)

        async def sliced(ready: Ready) -> NativeProcs:
            ready()
            return (await self._native).slice(**selection)

        return ProcMesh(start(sliced), extent)

    @property
    def initialized(self) -> Future[bool]:
        """Resolves once the processes are up."""
        return _once_up(self._native)

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor on these processes, then the processes."""

        self._stopped = True

        async def stop(ready: Ready) -> None:
            procs = await self._native
            ready()
            await procs.stop()

        return start(stop)

    def logging_option(
        self,
        stream_to_client: bool = True,
        aggregate_window_sec: int | None = 3,
        level: int = logging.INFO,
    ) -> Future[None]:
        """Monarch's log settings for these processes. Here each worker's output already goes to
        the controller's stderr as it is written, each line prefixed with its actor, so there
        is nothing to set: accepted, and without effect."""
        return settled(None)

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"<monarch ProcMesh, extent {self._extent}>"


# ---------------------------------------------------------------- crossing the boundary


_PLAIN = (str, int, float, bool, bytes, type(None))


class Port(NativePort[R]):
    """otpmesh's port (a value that travels; ``send`` never blocks) that also sends Monarch
    meshes: one still being spawned is sent once it is up, in order with this port's other
    sends."""

    __slots__ = ()

    def send(self, value: R) -> None:
        """Deliver `value` (a copy, as in any message); a Monarch mesh in it travels as the
        otpmesh mesh it stands for."""
        if not _holds_monarch(value):
            super().send(value)
            return
        now = _native_now(value)
        if now is not _PENDING:
            super().send(now)
            return

        async def send_when_up(ready: Ready) -> None:
            try:
                NativePort.send(self, await to_native(value))
            finally:
                ready()  # the next operation from here (a later send) goes after this one

        start(send_when_up)


def _native_now(value: Any) -> Any:
    """`value` with its Monarch meshes as the otpmesh ones, if each is made; else _PENDING."""
    if isinstance(value, ActorMesh | ProcMesh):
        native = value._native
        return native._result() if native.done() else _PENDING
    if not _holds_monarch(value):
        return value
    if isinstance(value, dict):
        mapping = {k: _native_now(v) for k, v in value.items()}
        return _PENDING if any(v is _PENDING for v in mapping.values()) else mapping
    items = [_native_now(v) for v in value]
    return _PENDING if any(v is _PENDING for v in items) else type(value)(items)


_PENDING = object()


def _holds_monarch(value: Any) -> bool:
    """Whether `value` is, or contains, a Monarch mesh (most arguments do not: checked first,
    at the cost of a type test per element, so they are sent as they are)."""
    if isinstance(value, _PLAIN):
        return False
    if isinstance(value, ActorMesh | ProcMesh):
        return True
    if isinstance(value, tuple | list):
        return any(_holds_monarch(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_monarch(v) for v in value.values())
    return False


async def to_native(value: Any) -> Any:
    """What travels for `value`: Monarch meshes become the otpmesh ones (waiting for them)."""
    if not _holds_monarch(value):
        return value
    if isinstance(value, ActorMesh | ProcMesh):
        return await value._native
    if isinstance(value, tuple | list):
        return type(value)([await to_native(v) for v in value])
    return {k: await to_native(v) for k, v in value.items()}


def to_monarch(value: Any) -> Any:
    """What Monarch code sees for a received `value`: otpmesh meshes wrapped as Monarch's."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, NativeActorMesh | ActorRef):
        return ActorMesh._of(value)
    if isinstance(value, NativeProcMesh | ProcMeshRef):
        return ProcMesh.from_otpmesh(value)
    if type(value) is NativePort:  # its sends may carry Monarch meshes
        return value.retyped(Port)
    if isinstance(value, NativeValueMesh):
        return ValueMesh(value.shape, [to_monarch(v) for v in value.values()])
    if isinstance(value, tuple | list):
        return type(value)(to_monarch(v) for v in value)
    if isinstance(value, dict):
        return {k: to_monarch(v) for k, v in value.items()}
    return value
