"""gather: many Futures awaited as one; each call sent at once, every reply waited for in one task.

``otpmesh.gather(*futures)`` is how one caller keeps thousands of calls in flight without a
task per call. A call that ``ref.ep(x)``'s hot path could send (one actor in another process,
up, its connection open, an endpoint without timeout or retry: ``Outgoing.call_now``) is
written at once, all of them in one pass (the connection coalesces frames sent together into
few writes), its reply landing in its own entry of one CallGroup: the caller parks once for
the whole batch and wakes once per read of replies, not once per reply. Every other Future
(broadcasts, reductions, timeouts, retries, actors restarting or in this process, ``later``)
is awaited in a task of its own, as a caller would. A call of the first kind that never
reached its actor (it was restarting) is sent again as ``Endpoint._gather`` sends one: to its
next incarnation; one that reached it and lost it reports the death.

Per call it keeps no more than the Future, its entry in the group and in a few lists (and the
connection's pending entry while the reply is due): a burst of 10,000 stays cheap for the
garbage collector (``_runtime/_gcpace.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from .._core._errors import CallTimeoutError
from ._calls import CallGroup
from ._endpoint import resend, send_into
from ._future import Future, give_back, outcome, settle, take
from ._node import Node, current_node
from ._slot import Slot


def gather(*futures: Future[Any], return_exceptions: bool = False) -> Future[list[Any]]:
    """A Future of every Future's result, in argument order: ``await otpmesh.gather(*(ref.ep(i)
    for i in range(n)))``. Every call is sent at once and all are waited for in the one task
    (calls to one actor in another process, without timeout or retry, with no task per call).

    It waits for every call to end, even after one failed: nothing it sent is left running
    behind its caller's back. Then the first failure in argument order is raised; with
    ``return_exceptions=True`` each failure is returned in its place instead. Cancelling it (or
    ``get(timeout)`` expiring: CallTimeoutError naming the calls still due) forgets every reply
    still due and tells their actors, as a single call does. A Future that has ended gives its
    result again; each Future ends with its own result too, so awaiting one afterwards returns
    it without sending anything. Arguments must be Futures (what endpoints return): anything
    else is a TypeError, at once."""
    for position, fut in enumerate(futures):
        if not isinstance(fut, Future):
            raise TypeError(
                f"otpmesh.gather takes Futures (what ref.ep(...) returns), and argument "
                f"{position} is {fut!r}: pass the endpoint's call itself, not its result or "
                f"a coroutine of your own"
            )
    if not isinstance(return_exceptions, bool):
        raise TypeError(f"return_exceptions must be True or False, not {return_exceptions!r}")
    return Future(_gather, futures, return_exceptions)


async def _gather(
    futures: tuple[Future[Any], ...], return_exceptions: bool, timeout: float | None
) -> list[Any]:
    unique = list(dict.fromkeys(futures))  # one Future given twice: sent once, its result twice
    batch = _Batch(unique)
    if timeout is None:
        outcomes = await batch.run()
    else:
        with trio.move_on_after(timeout):
            outcomes = await batch.run()
            return _results(futures, unique, outcomes, return_exceptions)
        raise CallTimeoutError(batch.late(), "gather", timeout)
    return _results(futures, unique, outcomes, return_exceptions)


def _results(
    futures: Sequence[Future[Any]],
    unique: list[Future[Any]],
    outcomes: list[tuple[bool, Any]],
    return_exceptions: bool,
) -> list[Any]:
    if len(unique) != len(futures):
        where = {id(fut): i for i, fut in enumerate(unique)}
        outcomes = [outcomes[where[id(fut)]] for fut in futures]
    if not return_exceptions:
        for ok, value in outcomes:
            if not ok:
                raise value
    return [value for _, value in outcomes]


class _Batch:
    """One gather's calls: those it sent itself (`sent`: their indices, slots, the versions
    they went to and their Futures' arguments) and the group every outcome lands in."""

    __slots__ = ("args", "futures", "group", "sent", "slots", "versions")

    def __init__(self, futures: list[Future[Any]]) -> None:
        self.futures = futures
        self.group = CallGroup([""] * len(futures))
        self.group.offered = []  # large tensors of the calls sent here: dropped at the end
        self.sent: list[int] = []
        self.slots: list[Slot] = []
        self.versions: list[int] = []
        self.args: list[tuple[Any, ...]] = []

    async def run(self) -> list[tuple[bool, Any]]:
        group = self.group
        node = current_node()
        try:
            general = self._send(node)
            async with trio.open_nursery() as nursery:
                for i in general:
                    nursery.start_soon(_await_into, group, i, self.futures[i])
                try:
                    await group.wait_all()
                finally:
                    if node is not None:  # replies still due are forgotten, their actors told
                        node.ended(self.slots, group)
            await self._resend()
        finally:
            self._settle()
        return group.results

    def _send(self, node: Node | None) -> list[int]:
        """Send every call the hot path can take; the indices of the Futures to await."""
        group, general = self.group, []
        for i, fut in enumerate(self.futures):
            if fut.done():
                group.deliver(i, *outcome(fut))
                continue
            parts = None if node is None else take(fut)
            if node is None or parts is None:  # no node here, or awaited elsewhere: awaiting
                general.append(i)  # it says so
                continue
            try:
                slot = send_into(node, group, i, *parts)
            except Exception as exc:  # an argument that cannot be encoded: this call's error
                self._took(i, None, parts[1])
                group.deliver(i, False, exc)
                continue
            if slot is None:
                give_back(fut, sent=False)
                general.append(i)
            else:
                self._took(i, slot, parts[1])
        return general

    def _took(self, index: int, slot: Slot | None, args: tuple[Any, ...]) -> None:
        self.sent.append(index)
        self.versions.append(-1 if slot is None else slot.version)
        self.args.append(args)
        if slot is not None:
            self.slots.append(slot)

    async def _resend(self) -> None:
        """Send again, the general way, each call sent here that never reached its actor."""
        again: list[tuple[int, Callable[[], Awaitable[list[tuple[bool, Any]]]]]] = []
        results, slots = self.group.results, iter(self.slots)
        for j, i in enumerate(self.sent):
            if self.versions[j] < 0:
                continue  # never sent (its arguments could not be encoded)
            slot = next(slots)
            ok, value = results[i]
            redo = None if ok else resend(self.args[j], slot, self.versions[j], value)
            if redo is not None:
                again.append((i, redo))
                results[i] = _DUE
        if again:
            async with trio.open_nursery() as nursery:
                for i, redo in again:
                    nursery.start_soon(_redo_into, results, i, redo)

    def _settle(self) -> None:
        """Each Future sent here ends with its outcome; one still due (the gather was
        cancelled) may be awaited again, and is sent again then."""
        results = self.group.results
        for i in self.sent:
            result = results[i]
            if type(result) is tuple:
                settle(self.futures[i], *result)
            else:
                give_back(self.futures[i])

    def late(self) -> list[str]:
        """The calls still due (what a timeout names)."""
        paths, results = self.group.paths, self.group.results
        return [
            paths[i] or repr(self.futures[i])
            for i, result in enumerate(results)
            if type(result) is not tuple
        ]


#: An entry whose call is being sent again (not a (ok, value) outcome yet).
_DUE: Any = object()


async def _await_into(group: CallGroup, index: int, fut: Future[Any]) -> None:
    try:
        value = await fut
    except Exception as exc:
        group.deliver(index, False, exc)
    else:
        group.deliver(index, True, value)


async def _redo_into(
    results: list[Any], index: int, redo: Callable[[], Awaitable[list[tuple[bool, Any]]]]
) -> None:
    try:
        results[index] = (await redo())[0]
    except Exception as exc:
        results[index] = (False, exc)
