"""CallGroup: the replies of one call to several actors, and the one task waiting for them."""

from __future__ import annotations

import trio
import trio.testing

from otpmesh._node._calls import CallGroup
from tests.conftest import run_trio


class _Steps(trio.abc.Instrument):
    """How many times each task ran (trio's public instrument hooks)."""

    def __init__(self) -> None:
        self.steps: dict[trio.lowlevel.Task, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task] = self.steps.get(task, 0) + 1


def test_a_call_to_several_actors_wakes_its_caller_once_when_the_last_reply_comes() -> None:
    async def body() -> None:
        group = CallGroup(["m/0", "m/1", "m/2", "m/3"])
        waiter: list[trio.lowlevel.Task] = []

        async def caller() -> None:
            waiter.append(trio.lowlevel.current_task())
            await group.wait_all()

        steps = _Steps()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.add_instrument(steps)
            for index in range(4):  # one reply per scheduler pass, as from four processes
                group.deliver(index, True, index)
                await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.remove_instrument(steps)
        assert steps.steps.get(waiter[0]) == 1
        assert [group.outcome(i) for i in range(4)] == [0, 1, 2, 3]

    run_trio(body, timeout=30)
