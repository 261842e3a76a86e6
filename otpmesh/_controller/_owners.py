"""Ownership: what an actor creates (proc meshes, declared subtrees) is linked to it.

An actor in any process of the app asks the controller to start processes or a subtree for it;
the controller records the actor as their owner. When the owner exits (stops, crashes, is
SIGKILLed, or fails to start), everything it owns is stopped, at any depth: an owned mesh's
actors may own more, and their exits are heard here too. One ``Owners`` per controller runtime.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from typing import Any, Protocol

import trio

from .._core._actor import current_path
from .._core._errors import MeshError
from .._runtime._controller_runtime import Runtime
from .._runtime._proc import Proc
from .._wire._connection import Connection

log = logging.getLogger("otpmesh.owners")

#: Seconds an owner's possessions get to stop in order before their processes are killed.
STOP_TIMEOUT = 5.0


class Owned(Protocol):
    """Something an actor owns: stopped (in order, then killed) when its owner exits."""

    label: str

    async def stop(self, timeout: float = STOP_TIMEOUT) -> None: ...


class Owners:
    """The controller's registry: every proc mesh of the app by id (handles to them travel to
    any process), and what each actor owns, by the actor's path."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.meshes: dict[str, Any] = {}  # id -> ProcMesh (imported above this module)
        self.owned: dict[str, list[Owned]] = {}
        self._ids = itertools.count(1)
        self._stops = 0  # owners' possessions being stopped now
        self._quiet = trio.Event()
        self._quiet.set()
        self._releasing: dict[str, trio.Event] = {}  # owner path -> its possessions stopped
        rt.exit_hooks.append(self._owner_exited)

    async def released(self, owner: str) -> None:
        """Wait until what the last incarnation of `owner` owned is stopped: a restarted owner
        starts after it, so two subtrees with one path never run at once."""
        releasing = self._releasing.get(owner)
        if releasing is not None:
            await releasing.wait()

    async def quiet(self) -> None:
        """Wait until what exited owners owned is stopped (a tree waits before it is done)."""
        await self._quiet.wait()

    def new_id(self) -> str:
        """A proc mesh's id: its handle is a capability (whoever was given it may spawn on it
        or stop it), so the id cannot be guessed."""
        return f"pm{next(self._ids)}-{secrets.token_hex(8)}"

    def add(self, owner: str | None, thing: Owned) -> None:
        """Link `thing` to the actor at path `owner` (None: the controller's own, kept until
        stopped or the run ends)."""
        if owner is not None:
            self.owned.setdefault(owner, []).append(thing)

    def discard(self, owner: str | None, thing: Owned) -> None:
        things = self.owned.get(owner or "")
        if things is not None and thing in things:
            things.remove(thing)
            if not things:
                del self.owned[owner or ""]

    def owns(self, owner: str) -> list[Owned]:
        return list(self.owned.get(owner, ()))

    def _owner_exited(self, path: str, incarnation: int, reason: object) -> None:
        # Told inline, before the owner's supervisor can restart it: whatever is listed now was
        # made by the incarnation that just ended.
        things = self.owned.pop(path, None)
        if things and self.rt.nursery is not None:
            if not self._stops:  # a new event only when none is pending: waiters keep theirs
                self._quiet = trio.Event()
            self._stops += 1
            self._releasing[path] = trio.Event()
            self.rt.nursery.start_soon(self._stop_all, path, things)

    async def _stop_all(self, owner: str, things: list[Owned]) -> None:
        released = self._releasing[owner]
        try:
            with trio.CancelScope(shield=True):
                async with trio.open_nursery() as nursery:
                    for thing in reversed(things):  # newest first, as supervisors stop children
                        nursery.start_soon(_stop_quietly, owner, thing)
        finally:
            released.set()
            if self._releasing.get(owner) is released:
                del self._releasing[owner]
            self._stops -= 1
            if not self._stops:
                self._quiet.set()


async def _stop_quietly(owner: str, thing: Owned) -> None:
    try:
        await thing.stop()
    except Exception:
        log.exception("stopping %s (owned by %s, which exited) failed", thing.label, owner)


def owners(rt: Runtime) -> Owners:
    """The registry of `rt` (made on first use)."""
    found = getattr(rt, "owners", None)
    if found is None:
        found = Owners(rt)
        rt.owners = found
    return found


def proc_of(rt: Runtime, conn: Connection | None) -> Proc | None:
    """The worker process behind `conn` (None: the controller itself)."""
    if conn is None:
        return None
    proc = rt.proc_on(conn)
    if proc is None:
        raise MeshError("only a worker process of this app may ask for this")
    return proc


def check_owner(rt: Runtime, conn: Connection | None, owner: object) -> str | None:
    """`owner` (an actor path, or None), checked to be an actor of the asking process: one
    process cannot make another's actor the owner of anything."""
    if owner is None:
        if conn is not None:
            raise MeshError("a worker's request must name the actor that owns what it starts")
        return None
    if not isinstance(owner, str) or not owner:
        raise MeshError(f"an owner is an actor path, not {owner!r}")
    proc = proc_of(rt, conn)
    if proc is None:
        # An actor placed in the controller (placement="local") asks from its own task, and
        # is not listed as running until its on_start, where it may start a subtree, is done.
        if owner not in rt.node.actors and current_path() != owner:
            raise MeshError(f"{owner} is not an actor of the controller process")
    elif owner not in proc.names:
        raise MeshError(f"{owner} is not an actor of the process that asked")
    return owner
