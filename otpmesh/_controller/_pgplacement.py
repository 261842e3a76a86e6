"""The placement that forms process groups: the app's own placement, with the meshes that are
``torch.distributed`` groups formed and re-formed around it, one epoch at a time
(``_pgroup.py``, docs/process-groups.md)."""

from __future__ import annotations

from typing import Any

import trio

from .._core._exits import ActorCrash
from .._core._spec import Mesh, ShutdownSpec, walk
from .._node._mesh import Slot
from .._runtime._controller_runtime import Runtime
from .._runtime._proc import Proc
from ._pgroup import ProcessGroup
from ._placement import LocalPlacement, Placement, SlotInfo, StartError


class _MemberListener:
    """Hears a member's exits before the tree does: a member that exits by itself breaks its
    group at once (the survivors are killed while the supervisor is still deciding)."""

    def __init__(self, inner: Any, group: ProcessGroup) -> None:
        self.inner = inner
        self.group = group

    def actor_exiting(self, path: str, incarnation: int) -> None:
        self.inner.actor_exiting(path, incarnation)

    def actor_exited(self, path: str, incarnation: int, reason: object) -> None:
        self.group.member_exited(path, incarnation)
        self.inner.actor_exited(path, incarnation, reason)

    async def resolve(self, path: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.inner.resolve(path)
        return result


class GroupPlacement:
    """The app's placement, with process-group meshes formed and re-formed around it."""

    def __init__(
        self,
        inner: Placement,
        rt: Runtime,
        specs: dict[str, Any],
        slot: Any,
        listeners: dict[str, Any],
        nursery: trio.Nursery,
    ) -> None:
        self.inner = inner
        self._rt = rt
        self._specs = specs  # path -> spec (the tree's, kept up to date by start_child)
        self._slot = slot
        self._listeners = listeners
        self._nursery = nursery
        self.groups: dict[str, ProcessGroup] = {}

    def _group(self, info: SlotInfo) -> ProcessGroup | None:
        spec = self._specs.get(info.name)
        if not isinstance(spec, Mesh) or spec.process_group is None:
            return None
        if isinstance(self.inner, LocalPlacement):
            raise StartError(ActorCrash("GroupError", _LOCAL_REFUSED.format(path=info.name)))
        group = self.groups.get(info.name)
        if group is None or group.spec is not spec:
            group = ProcessGroup(
                spec, info.name, info, self.inner, self._rt, self._slot, self._nursery
            )
            self.groups[info.name] = group
        for rank in range(spec.size):
            path = f"{info.name}/{rank}"
            current = self._listeners.get(path)
            if current is not None and not isinstance(current, _MemberListener):
                self._listeners[path] = _MemberListener(current, group)
        return group

    def _group_of(self, actor_path: str) -> ProcessGroup | None:
        return self.groups.get(actor_path.rpartition("/")[0])

    async def prepare(self, paths: list[str], infos: list[SlotInfo]) -> None:
        group = self._group(infos[0]) if infos else None
        if group is None:
            await self.inner.prepare(paths, infos)
        elif group.epoch is None and (procs := self._adopted(paths)) is not None:
            group.adopt(procs)  # a takeover found every member running, in its group
        elif group.needs_new_epoch(None):
            await group.open_epoch()

    def _adopted(self, paths: list[str]) -> dict[int, Proc] | None:
        """Rank -> process of every member a takeover found running (its first start here),
        or None unless it found all of them: a group missing a member must form anew."""
        adopted = getattr(self.inner, "adopted", None)
        procs = {rank: adopted(path) for rank, path in enumerate(paths)} if adopted else {}
        return procs if procs and all(procs.values()) else None

    async def start(
        self,
        slot: Slot,
        incarnation: int,
        actor: type | str,
        args: Any,
        kwargs: Any,
        info: SlotInfo,
    ) -> str:
        group = self._group(info)
        if group is None:
            return await self.inner.start(slot, incarnation, actor, args, kwargs, info)
        await group.member_ready(slot, info.rank)
        try:
            result = await self.inner.start(slot, incarnation, actor, args, kwargs, info)
        except StartError:
            if group.epoch is not None:
                group.break_epoch(group.epoch)
            raise
        group.member_started(info.rank, slot.actor_id, incarnation)
        return result

    async def stop(self, slot: Slot, incarnation: int, shutdown: ShutdownSpec) -> object:
        group = self._group_of(slot.actor_id)
        if group is not None:
            group.stopping()
        return await self.inner.stop(slot, incarnation, shutdown)

    def kill(self, slot: Slot) -> None:
        self.inner.kill(slot)

    async def close(self) -> None:
        for group in self.groups.values():
            group.close()
        await self.inner.close()

    async def inject(self, slot: Slot, kind: str, reason: object) -> bool:
        return await self.inner.inject(slot, kind, reason)

    def process(self, slot: Slot) -> Proc | None:
        return self.inner.process(slot)

    def __getattr__(self, name: str) -> Any:
        # Anything else a placement offers (added later) is the inner one's.
        return getattr(self.inner, name)


_LOCAL_REFUSED = (
    "Mesh {path!r} has a process_group, which needs placement='procs' (each member a process of "
    "its own); placement='local' runs every actor in this one process"
)


def with_process_groups(
    tree: Any, placement: Placement, rt: Runtime, context: Any, nursery: trio.Nursery
) -> Placement:
    """`placement`, wrapped to form process groups if `tree` holds a Mesh with one."""
    meshes = [path for path, spec in walk(tree) if isinstance(spec, Mesh) and spec.process_group]
    if not meshes:
        return placement
    if isinstance(placement, LocalPlacement):
        raise ValueError(_LOCAL_REFUSED.format(path=meshes[0]))
    return GroupPlacement(
        placement, rt, context.specs, context.slot, context.exit_listeners, nursery
    )
