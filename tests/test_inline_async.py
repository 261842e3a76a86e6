"""Async endpoints that cannot suspend (no await in their body) run where a plain-def endpoint
runs, at once when their actor is idle (_node/_inline.py): no task switch, no cancel scope.
What the actor's code sees must not change: its context, its traceback, its serial mailbox."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import otpmesh
from otpmesh._node._inline import never_suspends
from tests.conftest import run_trio


class Shapes:
    async def plain(self, x: Any) -> Any:
        return x

    async def awaits(self) -> None:
        await trio.sleep(0)

    async def with_async_with(self) -> None:
        async with trio.open_nursery():
            pass

    async def with_async_for(self, it: Any) -> None:
        async for _ in it:
            pass

    async def with_async_comprehension(self, it: Any) -> list[Any]:
        return [x async for x in it]

    def sync(self) -> int:
        return 1

    def returns_a_coroutine(self) -> Any:  # a wrapper: whose coroutine it is, we cannot tell
        return self.plain(1)

    async def generator(self) -> Any:
        yield 1


def test_only_an_async_def_without_await_is_said_never_to_suspend() -> None:
    assert never_suspends(Shapes, "plain")
    for name in (
        "awaits",
        "with_async_with",
        "with_async_for",
        "with_async_comprehension",
        "sync",
        "returns_a_coroutine",
        "generator",
        "missing",
    ):
        assert not never_suspends(Shapes, name), name


class OneStep(otpmesh.Actor):
    def __init__(self) -> None:
        self.history: list[Any] = []

    @otpmesh.endpoint
    async def where(self) -> str:
        return otpmesh.context().path

    @otpmesh.endpoint
    async def task(self) -> str:
        return trio.lowlevel.current_task().name

    @otpmesh.endpoint
    async def task_after_await(self) -> str:
        await trio.sleep(0)
        return trio.lowlevel.current_task().name

    @otpmesh.endpoint
    async def record(self, x: Any) -> list[Any]:
        self.history.append(x)
        return self.history

    @otpmesh.endpoint
    async def slow_record(self, x: Any, seconds: float) -> None:
        await trio.sleep(seconds)
        self.history.append(x)

    @otpmesh.endpoint(let_it_crash=False)
    async def fail(self, message: str) -> None:
        raise ValueError(message)


def test_an_async_endpoint_without_await_runs_at_once_and_keeps_the_actors_semantics() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            ref = (await procs.spawn("one", OneStep))[0]
            # It ran in the connection's task, not the actor's (one awaiting shows that one).
            assert await ref.task() != await ref.task_after_await()
            assert await ref.where() == "one/0"  # its actor's context all the same
            with pytest.raises(otpmesh.ActorError, match="ValueError: no") as info:
                await ref.fail("no")
            assert 'test_inline_async.py", line' in info.value.traceback
            assert "_cell.py" not in info.value.traceback  # the user's frames only
            # While the actor is busy, it waits its turn in the mailbox (serial, in order).
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ref.slow_record, "first", 0.3)
                await trio.sleep(0.1)
                assert await ref.record("second") == ["first", "second"]

    run_trio(body)
