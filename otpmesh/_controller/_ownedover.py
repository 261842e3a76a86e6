"""Trees that actors own (``context().start``) across a takeover.

While a controller runs with a takeover, each subtree an actor starts is journalled (an
``owned`` record: its root's path, its owner, its spec as wire data, the key its owner's handle
stops it with) and its end too (``owned_done``). A standby that took the tree over and found an
owner running starts that owner's subtree again from the record, in resume mode: its
supervisors resume their journalled child lists and adopt the actors still running in the
adopted processes, as the declared tree's do (_livejournal.py), so its actors keep their state
and pids, and the owner's handle (its refs, its key) works as before. A subtree whose owner
died in the gap is not resumed: the owner's restart starts a new one, and the old one's actors
are stopped. The app's singletons (``otpmesh.singleton``) are a tree the controller runs for
itself: a standby resumes it too, each singleton with its state.
"""

from __future__ import annotations

import base64
import binascii
import logging
from typing import Any, Protocol

from .._core._errors import EncodeError, ProtocolError
from .._core._spec import Mesh, Supervisor
from .._core._spec_errors import SpecError
from .._runtime._controller_runtime import Runtime
from .._runtime._proc import Proc
from .._wire._codec import pack, unpack
from ._placement import ProcsPlacement
from ._specwire import spec_from_wire, spec_to_wire

#: Where singletons live: one supervisor at the top of the app, started on first use.
SINGLETONS = "singletons"


class ResumesSubtrees(Protocol):
    """What starts an owned tree, or the singletons, again for a takeover (_owned.py's
    ``Service``)."""

    async def resume_subtree(
        self, owner: str, spec: Supervisor | Mesh, key: str, placement: ProcsPlacement
    ) -> None: ...

    async def resume_singletons(self, placement: ProcsPlacement) -> None: ...


log = logging.getLogger("otpmesh.takeover")


def journal_owned(rt: Runtime, root: str, owner: str, spec: Supervisor | Mesh, key: str) -> bool:
    """Journal the subtree at `root` that `owner` started (False: it cannot be, its spec
    does not travel: a standby will say so)."""
    state = rt.takeover
    if state is None:
        return False
    try:
        text = base64.b64encode(pack(spec_to_wire(spec))).decode()
    except EncodeError:
        return False
    state.journal.append({"owned": root, "owner": owner, "spec": text, "key": key})
    return True


def journal_owned_done(rt: Runtime, root: str) -> None:
    state = rt.takeover
    if state is not None:
        state.journal.append({"owned_done": root})


async def resume_owned(
    rt: Runtime,
    service: ResumesSubtrees,
    records: list[dict[str, Any]],
    procs: dict[str, Proc],
    running: dict[str, int],
    heartbeat_timeout: float,
) -> dict[str, str]:
    """Start again each journalled subtree whose owner a takeover adopted running (`running`:
    actor path -> incarnation, in `procs`), in the order they were started (an owner inside a
    subtree comes after it), and the singletons, each in resume mode in the processes of its
    own actors. Those not started again have their actors stopped and their processes ended;
    they are returned, each with why."""
    resumed: list[str] = []
    skipped: dict[str, str] = {}
    roots = [SINGLETONS, *(str(r["owned"]) for r in records)]

    def placement_of(root: str) -> ProcsPlacement:
        mine = [p for p in running if owned_by(p, roots) == root]
        adopted = {p: procs[p] for p in mine if p in procs}
        return ProcsPlacement(rt, adopted, heartbeat_timeout, {p: running[p] for p in mine})

    journal = rt.live_journal
    if journal is not None and journal.has(SINGLETONS):
        try:
            await service.resume_singletons(placement := placement_of(SINGLETONS))
        except Exception as exc:
            skipped[SINGLETONS] = f"they failed to start: {exc}"
        else:
            await placement.stop_unadopted(lambda path: True)
            resumed.append(SINGLETONS)
    for record in records:
        root, owner = str(record["owned"]), str(record["owner"])
        if owner not in running:
            skipped[root] = f"its owner {owner} did not live through the gap"
            continue
        try:
            spec = spec_from_wire(unpack(base64.b64decode(str(record["spec"]), validate=True)))
        except (binascii.Error, ProtocolError, SpecError, TypeError) as exc:
            skipped[root] = f"its spec could not be rebuilt: {exc}"
            continue
        if not isinstance(spec, Supervisor | Mesh):
            skipped[root] = "its spec is not a Supervisor or a Mesh"
            continue
        try:
            await service.resume_subtree(owner, spec, str(record["key"]), placement_of(root))
        except Exception as exc:  # that subtree's business: the takeover goes on
            skipped[root] = f"it failed to start: {exc}"
            continue
        resumed.append(root)
    for root in roots:
        if root in resumed or not any(owned_by(p, roots) == root for p in running):
            continue
        skipped.setdefault(root, "its child list was not journalled")
        placement = placement_of(root)  # nobody's now: its actors stopped, its processes gone
        await placement.stop_unadopted(lambda path: True)
        await placement.close()
    for root in skipped if journal is not None else ():
        journal.forget(root)  # a new tree of a restarted owner starts afresh
    return skipped


def owned_by(path: str, roots: list[str]) -> str | None:
    """The deepest of `roots` (owned trees') that `path` lies under (None: none)."""
    under = [r for r in roots if path.startswith(r + "/")]
    return max(under, key=len) if under else None
