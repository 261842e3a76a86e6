"""The general way of a call (every way falls back on it): an attempt per incarnation within the
endpoint's timeout, and the resend rule: a call that never reached a supervised actor (it was
restarting) is sent again to its next incarnation; one that reached it and lost it reports the
failure, unless the endpoint was made ``with_retry(lost=n)``. ``Attempts`` is that part of
``Endpoint`` (_endpoint.py; its state is the endpoint's)."""

from __future__ import annotations

from typing import Any

import trio

from .._core._errors import ActorDiedError, CallTimeoutError, MeshError
from ._calls import CallGroup
from ._lost import LostRetry
from ._node import Node, current_node
from ._slot import Slot


def calling_node() -> Node:
    """This trio run's node: the one the refs and meshes it made call through."""
    node = current_node()
    if node is None:
        raise MeshError(
            "no otpmesh node is running in this trio run: refs and meshes work inside actors "
            "and in the run that made them (otpmesh.proc_mesh() or otpmesh.start())"
        )
    return node


class Attempts:
    """Calls sent, awaited and sent again until each slot has its outcome."""

    __slots__ = ()

    _name: str
    _timeout: float | None
    _retry: LostRetry

    async def _outcomes(
        self, slots: list[Slot], args: Any, kwargs: Any, seen: list[int] | None = None
    ) -> list[tuple[bool, Any]]:
        """(ok, value-or-error) per slot, within this endpoint's timeout; `seen`: the slots'
        versions a first attempt was sent to (its share is sent to a newer one)."""
        attempt = Attempt()
        if seen is None:
            seen = [-1] * len(slots)
        if self._timeout is None:
            return await self._gather(slots, args, kwargs, attempt, seen)
        with trio.move_on_after(self._timeout):
            return await self._gather(slots, args, kwargs, attempt, seen)
        raise CallTimeoutError(attempt.late(), self._name, self._timeout)

    async def _gather(
        self, slots: list[Slot], args: Any, kwargs: Any, attempt: Attempt, seen: list[int]
    ) -> list[tuple[bool, Any]]:
        # A call that never reached a supervised actor (it was restarting) is sent again to the
        # next incarnation; a call that reached it and lost it reports the failure, unless
        # this endpoint was made `with_retry(lost=...)` and the member has re-sends left.
        node = calling_node()
        lost = self._retry.budget(len(slots))
        results: list[tuple[bool, Any]] = [(False, None)] * len(slots)
        todo = list(range(len(slots)))
        while todo:
            attempt.group, attempt.paths = None, [slots[i].actor_id for i in todo]
            for i in todo:
                if slots[i].remote and seen[i] >= 0:
                    await node.resolve(slots[i])
                else:
                    await slots[i].wait_up(seen[i])
                seen[i] = slots[i].version
            batch = [slots[i] for i in todo]
            group = await node.call(batch, attempt.paths, self._name, args, kwargs)
            attempt.group = group
            try:
                await group.wait_all()
            finally:
                node.ended(batch, group)
            retry = []
            for j, i in enumerate(todo):
                ok, value = group.results[j]
                if not ok and (resendable(slots[i], value) or lost.take(i, slots[i], value)):
                    retry.append(i)
                else:
                    results[i] = (ok, value)
            todo = retry
        return results


class Attempt:
    """The slots a call is still waiting for, to name them if it times out."""

    __slots__ = ("group", "paths")

    def __init__(self) -> None:
        self.group: CallGroup | None = None
        self.paths: list[str] = []

    def late(self) -> list[str]:
        if self.group is None:
            return self.paths
        return [self.group.paths[i] for i in self.group.missing()]


def resendable(slot: Slot, error: Any) -> bool:
    """Whether `error` says the call never reached the supervised actor at `slot` (it was
    restarting): then it is sent again, to the next incarnation."""
    return (
        isinstance(error, ActorDiedError)
        and not error.delivered
        and slot.supervised
        and slot.gone is None
    )


def unwrap(outcome: tuple[bool, Any]) -> Any:
    """The value of an (ok, value-or-error) outcome; its error raised."""
    ok, value = outcome
    if ok:
        return value
    raise value
