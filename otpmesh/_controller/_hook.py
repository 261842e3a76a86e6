"""The owner hook, in Monarch's shape: an actor that spawned a mesh imperatively (not as a
declared subtree) hears of its actors' abnormal exits through ``__supervise__(failure) -> bool``.

True: handled (the owner lives; it may replace the mesh). Anything else, an exception, or no hook
at all: the owner crashes with the failure as its reason, and its own supervisor takes over. A
mesh the controller spawned for itself has no owner: its exits are only logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from .._core._actor import SUPERVISE_HOOK as HOOK
from .._core._exits import ActorCrash, describe
from .._core._reasons import is_normal_exit
from .._core._supevents import LogEntry, LogKind
from .._node._failure import MeshFailure
from .._runtime._controller_runtime import Runtime
from ._events import EventLog
from ._subtree import crash_owner, owner_ref

log = logging.getLogger("otpmesh.procmesh")


class Unsupervised:
    """Hears the exits of a proc mesh's unsupervised actors: its event log, and its owner."""

    def __init__(
        self,
        rt: Runtime,
        events: EventLog,
        mesh: str,
        owner: str | None,
        stopping: Callable[[], bool],
    ) -> None:
        self._rt = rt
        self._events = events
        self._mesh = mesh
        self._owner = owner
        self._stopping = stopping  # stopped on purpose (by its owner's exit, or stop()): quiet

    def actor_exiting(self, path: str, incarnation: int) -> None:
        return None

    def actor_exited(self, path: str, incarnation: int, reason: object) -> None:
        name, _, rank = path.rpartition("/")
        entry = LogEntry(trio.current_time(), LogKind.CHILD_EXITED, name, rank, incarnation, reason)
        self._events.append(entry)
        if is_normal_exit(reason) or self._stopping():
            return
        failure = MeshFailure(self._mesh, path, int(rank), describe(reason))
        if self._owner is None:
            log.warning(
                "%s (unsupervised) exited: %s; it will not be restarted", path, describe(reason)
            )
            for listener in self._rt.unowned_failures:
                listener(failure)
            return
        if self._rt.nursery is not None:
            self._rt.nursery.start_soon(tell_owner, self._rt, self._owner, failure)

    async def resolve(self, path: str) -> dict[str, Any]:
        return {"gone": f"{path} is not supervised and its process is gone"}


async def tell_owner(rt: Runtime, owner: str, failure: MeshFailure) -> None:
    """Run the owner's hook on `failure` (in its mailbox, in turn); crash it unless handled."""
    ref = owner_ref(rt, owner)
    if ref is None:
        return  # the owner is gone already: what it owned is being stopped with it
    raised = ""
    try:
        handled = await ref.endpoint(HOOK).call_one(failure)
    except Exception as exc:
        log.info("%s did not handle %s: %s", owner, failure, exc)
        handled = False
        raised = f", which raised: {exc}"  # the hook's own error, in the owner's reason too
    if handled is not True:
        why = f"{failure} (not handled by its owner's {HOOK}{raised})"
        await crash_owner(rt, owner, ActorCrash("MeshFailure", why))
