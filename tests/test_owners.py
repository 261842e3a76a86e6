"""The ownership registry's bookkeeping (otpmesh/_controller/_owners.py), driven step by step
under trio's MockClock: what exited owners owned is stopped, and waiters hear when it is."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from otpmesh._controller._owners import Owners


class _Runtime:
    """What Owners uses of a controller runtime: the exit hooks and a nursery."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.exit_hooks: list[Any] = []
        self.nursery = nursery


class _Thing:
    def __init__(self, label: str) -> None:
        self.label = label
        self.release = trio.Event()
        self.stopped = False

    async def stop(self, timeout: float = 5.0) -> None:
        await self.release.wait()
        self.stopped = True


def test_a_waiter_hears_quiet_when_overlapping_stops_are_all_done() -> None:
    # Two owners exit one after the other while the first's possessions are still stopping: a
    # waiter that came in between must wake once both are done (it once waited for ever, on an
    # event the second exit had replaced).
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            rt = _Runtime(nursery)
            owners = Owners(rt)  # type: ignore[arg-type]
            first, second = _Thing("a's"), _Thing("b's")
            owners.add("a", first)
            owners.add("b", second)
            owners._owner_exited("a", 1, "crash")
            woke = trio.Event()

            async def wait_quiet() -> None:
                await owners.quiet()
                woke.set()

            nursery.start_soon(wait_quiet)
            await trio.testing.wait_all_tasks_blocked()
            owners._owner_exited("b", 1, "crash")
            first.release.set()
            await trio.testing.wait_all_tasks_blocked()
            assert not woke.is_set()  # b's possessions are still stopping
            second.release.set()
            with trio.fail_after(1):
                await woke.wait()
            assert first.stopped and second.stopped
            with trio.fail_after(1):
                await owners.released("a")
                await owners.released("b")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
