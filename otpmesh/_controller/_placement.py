"""Where supervised actors run: each slot in a worker process of its own (``"procs"``, the
default), or all of them inside the controller (``"local"``, for fast deterministic tests).

A placement starts and stops one actor incarnation at a time for the supervision driver and
keeps each slot's process: an actor that crashed is restarted inside its live process; a slot
whose process died gets a fresh one from the fork server, pinned as the old one was.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from .._core._actor import Actor, class_path
from .._core._errors import ActorDiedError, ActorError, EncodeError, SpawnError
from .._core._exits import ActorCrash, Hung, ProcessExit
from .._core._reasons import KILLED, NORMAL, SHUTDOWN
from .._core._spec import Shutdown, ShutdownSpec
from .._node._host import STARTED, ActorHost, StartFailed, spawn_request
from .._node._mesh import Slot
from .._runtime._controller_runtime import Runtime
from .._runtime._exitnews import ExitListener
from .._runtime._liveness import proc_state
from .._runtime._proc import HEARTBEAT_TIMEOUT, Proc
from .._wire import _codec
from ._owners import owners
from ._slotenv import otpmesh_settings, slot_env, visible_gpus

# How long past its shutdown timeout a worker may take to confirm a stop before its whole
# process is killed (an actor stuck in code that never yields cannot be cancelled in-process).
_STOP_GRACE = 0.25


#: What ``start`` returns for an actor a takeover found running in an adopted process.
ADOPTED = "adopted"


class StartError(Exception):
    """A start failed with `reason` (an exit reason: what the supervisor core records)."""

    def __init__(self, reason: object) -> None:
        self.reason = reason
        super().__init__(str(reason))


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """Where one actor sits: its mesh's name and shape, its rank and coordinates."""

    name: str
    rank: int
    coords: dict[str, int]
    shape: dict[str, int]
    progress_deadline: float | None = None  # the child spec's (seconds; None: none)
    start_timeout: float | None = None  # the child spec's (seconds; None: none)
    heal: dict[str, Any] | None = None  # a restart in a healing mesh: peers, fallback (_heal.py)


class Placement(Protocol):
    async def prepare(self, paths: list[str], infos: list[SlotInfo]) -> None: ...
    async def start(
        self,
        slot: Slot,
        incarnation: int,
        actor: type | str,
        args: Any,
        kwargs: Any,
        info: SlotInfo,
    ) -> str: ...
    async def stop(self, slot: Slot, incarnation: int, shutdown: ShutdownSpec) -> object: ...
    def kill(self, slot: Slot) -> None: ...
    async def close(self) -> None: ...
    async def inject(self, slot: Slot, kind: str, reason: object) -> bool: ...
    def process(self, slot: Slot) -> Proc | None: ...


def _payload(
    path: str, incarnation: int, actor: type | str, args: Any, kwargs: Any, info: SlotInfo
) -> dict[str, Any]:
    return spawn_request(
        path,
        incarnation,
        class_path(actor) if isinstance(actor, type) else actor,
        name=info.name,
        rank=info.rank,
        coords=info.coords,
        shape=info.shape,
        args=args,
        kwargs=kwargs,
        progress_deadline=info.progress_deadline,
        start_timeout=info.start_timeout,
        heal=info.heal,
    )


async def spawn_on(rt: Runtime, proc: Proc, payload: dict[str, Any]) -> str:
    """Start an actor in a worker: 'started' or 'ignored'. StartError with the crash when its
    constructor or on_start raised (the worker answers with it, the user's frames only)."""
    if proc.conn is None:
        raise StartError(ProcessExit(proc.pid, proc.exit_reason or "never connected"))
    try:
        result = await rt.node.sys_call(proc.conn, "spawn_actor", payload, str(payload["id"]))
    except EncodeError as exc:
        raise StartError(_unsendable(payload, exc)) from None
    proc.started = True  # it answered: its start is over, its heartbeat is what judges it
    if isinstance(result, ActorCrash | Hung):
        raise StartError(result)
    return str(result)


def _unsendable(payload: dict[str, Any], exc: EncodeError) -> ActorCrash:
    """The start failure of an actor whose arguments the wire refused, naming the argument.
    (Code in them was refused when the spec was built, _core/_sendable.py: this is what only
    the codec knows, such as tuples nested too deep.)"""
    named = [(f"args[{i}]", v) for i, v in enumerate(payload["args"])]
    named += [(f"kwargs[{k!r}]", v) for k, v in payload["kwargs"].items()]
    for where, value in named:
        try:
            _codec.pack(value, local=True)
        except EncodeError as found:
            return ActorCrash("EncodeError", f"{where} cannot travel to the actor: {found}")
    return ActorCrash("EncodeError", f"its arguments cannot travel to the actor: {exc}")


def _timeout(shutdown: ShutdownSpec) -> tuple[float | None, bool]:
    """(seconds or None for infinity, brutal?) of a shutdown spec."""
    if shutdown is Shutdown.BRUTAL_KILL:
        return 0.0, True
    if shutdown is Shutdown.INFINITY:
        return None, False
    return float(shutdown), False


class ProcsPlacement:
    """Every slot in a worker process of its own."""

    def __init__(
        self,
        rt: Runtime,
        procs: dict[str, Proc] | None = None,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        running: dict[str, int] | None = None,
    ) -> None:
        self._rt = rt
        self._procs: dict[str, Proc] = dict(procs or {})  # by actor path: its slot's process
        # Actors a takeover found running in adopted processes (path -> incarnation): their
        # first start is taken as done, state and all (_takeover.py).
        self._running: dict[str, int] = dict(running or {})
        self._gpus = visible_gpus()
        self._heartbeat_timeout = heartbeat_timeout

    async def prepare(self, paths: list[str], infos: list[SlotInfo]) -> None:
        """Fork the processes of a group's slots all at once (a mesh starts in one go)."""
        missing = [
            (p, i)
            for p, i in zip(paths, infos, strict=True)
            if p not in self._procs or not self._procs[p].alive
        ]
        if not missing:
            return
        settings = otpmesh_settings()
        procs = await self._rt.start_procs(
            missing[0][1].shape or {"procs": 1},
            [i.coords for _, i in missing],
            [slot_env(i.coords, i.rank, self._gpus, settings) for _, i in missing],
            self._heartbeat_timeout,
        )
        for (path, _), proc in zip(missing, procs, strict=True):
            self._procs[path] = proc

    async def start(
        self,
        slot: Slot,
        incarnation: int,
        actor: type | str,
        args: Any,
        kwargs: Any,
        info: SlotInfo,
    ) -> str:
        path = slot.actor_id
        try:
            await self.prepare([path], [info])
        except SpawnError as exc:
            raise StartError(ActorCrash("SpawnError", str(exc))) from exc
        proc = self._procs[path]
        proc.named(path)
        if self._running.pop(path, None) == incarnation and proc.actors.get(path) == incarnation:
            self._started(slot, path, incarnation, proc)
            return ADOPTED
        await owners(self._rt).released(path)  # its last incarnation's possessions are gone
        try:
            payload = _payload(path, incarnation, actor, args, kwargs, info)
            result = await spawn_on(self._rt, proc, payload)
        except ActorError as exc:
            reason: object = ActorCrash(exc.type_name, exc.message, exc.traceback)
            self._rt.exited_hooks(path, incarnation, reason)  # what it made in on_start goes
            raise StartError(reason) from exc
        except ActorDiedError as exc:
            # Its process died in the start: a start its watchdog found hung says so (with
            # its stack), as an actor's exit does.
            reason = self._rt.exit_reason_of(proc, path)
            if not isinstance(reason, Hung):
                reason = ProcessExit(proc.pid, proc.exit_reason or exc.reason)
            self._rt.exited_hooks(path, incarnation, reason)
            raise StartError(reason) from exc
        if result == STARTED:
            self._started(slot, path, incarnation, proc)
        else:
            self._rt.exited_hooks(path, incarnation, NORMAL)  # ignored: it owns nothing
        if proc.host is None:
            self._rt.want_spare()  # the next restart's process, forked now it costs no one
        return str(result)

    def _started(self, slot: Slot, path: str, incarnation: int, proc: Proc) -> None:
        proc.hosted(path, incarnation)
        slot.mark_up(proc.addr, proc)
        if self._rt.takeover is not None:  # on this host or an agent's (_hostover.py)
            self._rt.takeover.actor_started(path, incarnation, proc)

    async def stop(self, slot: Slot, incarnation: int, shutdown: ShutdownSpec) -> object:
        proc = self._procs.get(slot.actor_id)
        if proc is None or proc.conn is None or not proc.alive:
            return ProcessExit(proc.pid if proc else 0, (proc and proc.exit_reason) or "is gone")
        seconds, brutal = _timeout(shutdown)
        if proc.host is None and proc_state(proc.pid) in ("T", "t"):
            # Stopped (SIGSTOP, a debugger): it cannot run on_stop or answer; waiting for it
            # would only wait out the shutdown timeout. Killed at once, as a brutal kill is.
            self._rt.kill(proc)
            await proc.exited.wait()
            return KILLED
        request = {
            "id": slot.actor_id,
            "incarnation": incarnation,
            "reason": SHUTDOWN,
            "timeout": seconds,
            "brutal": brutal,
        }
        deadline = math.inf if seconds is None else seconds + _STOP_GRACE
        with trio.move_on_after(deadline):
            try:
                return await self._rt.node.sys_call(proc.conn, "stop_actor", request, slot.actor_id)
            except ActorDiedError:
                return ProcessExit(proc.pid, proc.exit_reason or "is gone")
        # The worker did not confirm in time (stuck outside trio, or stopped): kill the process.
        self._rt.kill(proc)
        await proc.exited.wait()
        return KILLED

    def kill(self, slot: Slot) -> None:
        proc = self._procs.get(slot.actor_id)
        if proc is not None:
            self._rt.kill(proc)

    async def inject(self, slot: Slot, kind: str, reason: object) -> bool:
        proc = self._procs.get(slot.actor_id)
        if proc is None or proc.conn is None or not proc.alive:
            return False
        request = {"id": slot.actor_id, "kind": kind, "reason": reason}
        try:
            return bool(await self._rt.node.sys_call(proc.conn, "inject", request, slot.actor_id))
        except (ActorDiedError, trio.ClosedResourceError):
            return False  # its process is going: the exit is on its way

    def process(self, slot: Slot) -> Proc | None:
        proc = self._procs.get(slot.actor_id)
        return proc if proc is not None and proc.alive else None

    def adopted(self, path: str) -> Proc | None:
        """The live process a takeover found the actor at `path` running in, until its first
        start here takes it as started; else None."""
        proc = self._procs.get(path)
        incarnation = self._running.get(path)
        if proc is None or not proc.alive or incarnation is None:
            return None
        return proc if proc.actors.get(path) == incarnation else None

    async def stop_unadopted(self, ours: Callable[[str], bool]) -> list[str]:
        """Once a takeover resumed its tree: stop each actor it found running that no
        supervisor took over (a start the old controller had under way, whose end it never
        journalled), of those whose path is `ours`, brutally; their paths."""
        left = {p: n for p, n in self._running.items() if ours(p)}
        for path in left:
            del self._running[path]
        for path, incarnation in left.items():
            proc = self._procs.get(path)
            if proc is None or proc.conn is None or proc.actors.get(path) != incarnation:
                continue
            request = {
                "id": path,
                "incarnation": incarnation,
                "reason": KILLED,
                "timeout": 0.0,
                "brutal": True,
            }
            with contextlib.suppress(ActorDiedError):
                await self._rt.node.sys_call(proc.conn, "stop_actor", request, path)
        return sorted(left)

    async def close(self) -> None:
        self._rt.retire_spare()  # stopped: no process of this tree will be restarted
        for proc in self._procs.values():
            self._rt.shutdown(proc, {"timeout": 1.0})
        with trio.move_on_after(3.0):
            for proc in self._procs.values():
                await proc.exited.wait()
        for proc in self._procs.values():
            self._rt.kill(proc)


class LocalPlacement:
    """Every actor inside the controller process: the same supervision, no processes."""

    def __init__(self, rt: Runtime, listener: ExitListener, nursery: trio.Nursery) -> None:
        self._node = rt.node
        self._rt = rt

        # Actor tasks run in the application's nursery: their fate is the app's, not the node's.
        def exited(path: str, incarnation: int, reason: object) -> None:
            listener.actor_exited(path, incarnation, reason)
            rt.exited_hooks(path, incarnation, reason)

        self._host = ActorHost(rt.node, exited, listener.actor_exiting, nursery)

    async def prepare(self, paths: list[str], infos: list[SlotInfo]) -> None:
        return None

    async def start(
        self,
        slot: Slot,
        incarnation: int,
        actor: type | str,
        args: Any,
        kwargs: Any,
        info: SlotInfo,
    ) -> str:
        payload = _payload(slot.actor_id, incarnation, actor, args, kwargs, info)
        if isinstance(actor, type) and issubclass(actor, Actor):
            payload["cls"] = actor
        await owners(self._rt).released(slot.actor_id)
        try:
            result = await self._host.spawn(payload)
        except StartFailed as exc:
            raise StartError(exc.crash) from None
        except Exception as exc:
            reason = ActorCrash.of(exc)
            self._rt.exited_hooks(slot.actor_id, incarnation, reason)
            raise StartError(reason) from exc
        if result == STARTED:
            slot.mark_up(self._node.addr, None)
        else:
            self._rt.exited_hooks(slot.actor_id, incarnation, NORMAL)
        return result

    async def stop(self, slot: Slot, incarnation: int, shutdown: ShutdownSpec) -> object:
        seconds, brutal = _timeout(shutdown)
        return await self._host.stop(slot.actor_id, incarnation, SHUTDOWN, seconds, brutal)

    def kill(self, slot: Slot) -> None:
        cell = self._node.actors.get(slot.actor_id)
        if cell is not None:
            cell.kill()

    async def close(self) -> None:
        return None

    async def inject(self, slot: Slot, kind: str, reason: object) -> bool:
        return self._host.inject(slot.actor_id, kind, reason)

    def process(self, slot: Slot) -> Proc | None:
        return None  # in-process: there is no process of its own to signal
