"""otpmesh.Future: what calls return, awaited in trio or an asyncio actor, or ``.get()`` from a
thread that may block; one Future, one result."""

from __future__ import annotations

import gc
import warnings

import pytest
import trio
import trio.testing

import otpmesh
from otpmesh._node._future import later
from tests.actors import Asker, Echo
from tests.aio_actors import Rollout
from tests.conftest import run_trio


@pytest.mark.timeout(60)
def test_a_future_is_lazy_awaited_in_trio_and_keeps_its_one_result() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("w", Echo)
            record = mesh[0].record(1)
            assert isinstance(record, otpmesh.Future) and not record.done()
            assert await mesh[0].history() == []  # not awaited: nothing was sent
            await record
            await record  # its result again: not sent twice
            assert record.done() and await mesh[0].history() == [1]
            failing = mesh[1].fail("once")
            with pytest.raises(otpmesh.ActorError, match="once") as first:
                await failing
            with pytest.raises(otpmesh.ActorError) as again:
                await failing
            assert again.value is first.value

    run_trio(body)


@pytest.mark.timeout(60)
def test_a_future_runs_as_a_task_and_refuses_a_second_await_while_in_flight() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            mesh = await procs.spawn("w", Echo)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(mesh.record.call, "from a task")  # a Coroutine to trio
            assert await mesh[0].history() == ["from a task"]
            slow = mesh[0].sleep(30)

            async def first() -> None:
                await slow

            async with trio.open_nursery() as nursery:
                nursery.start_soon(first)
                await trio.testing.wait_all_tasks_blocked()  # in flight from now on
                with pytest.raises(otpmesh.MeshError, match="being awaited already"):
                    await slow
                nursery.cancel_scope.cancel()

    run_trio(body)


@pytest.mark.timeout(60)
def test_get_in_a_trio_thread_refuses_with_the_fix_and_nothing_is_sent() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            mesh = await procs.spawn("w", Echo)
            with pytest.raises(
                otpmesh.MeshError,
                match=r"Use 'await', or mark the endpoint @endpoint\(blocking=True\)",
            ):
                mesh[0].record("blocked").get()
            assert await mesh[0].history() == []

    run_trio(body)


@pytest.mark.timeout(60)
def test_get_from_a_worker_thread_of_the_run_reaches_the_run() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("w", Echo)
            values = await trio.to_thread.run_sync(lambda: mesh.echo("t").get())
            assert values.values() == ["t", "t"]

            def late() -> None:
                mesh[1].sleep(30).get(timeout=0.5)

            with pytest.raises(otpmesh.CallTimeoutError, match=r"'sleep' on w/1 timed out"):
                await trio.to_thread.run_sync(late)

    run_trio(body)


@pytest.mark.timeout(60)
def test_an_asyncio_actor_awaits_a_future_through_its_trio_run() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            rollouts = await procs.spawn("r", Rollout)
            assert await rollouts[0].ask(rollouts[1], "hi") == "HI"

    run_trio(body)


@pytest.mark.timeout(60)
def test_get_in_an_actors_worker_thread_calls_out_and_still_refuses_a_call_cycle() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            askers = await procs.spawn("a", Asker)
            assert await askers[0].ask_in_thread(askers[1], "x") == "x"
            with pytest.raises(otpmesh.ActorError, match="DeadlockError: call cycle a/0 -> a/0"):
                await askers[0].ask_in_thread(askers[0], "me")

    run_trio(body)


def test_a_future_that_is_not_a_call_times_out_saying_what_it_was() -> None:
    async def body() -> None:
        waiting = later("waiting for the test", trio.sleep, 30)
        with pytest.raises(otpmesh.CallTimeoutError, match=r"^waiting for the test timed out"):
            await trio.to_thread.run_sync(lambda: waiting.get(timeout=0.05))
        # A call that timed out has ended: its one result is that error (only a cancelled
        # wait leaves a Future to be awaited again).
        assert waiting.done()
        with pytest.raises(otpmesh.CallTimeoutError):
            await waiting

    run_trio(body)


@pytest.mark.timeout(60)
def test_a_call_never_awaited_is_reported_with_its_actor_endpoint_and_line() -> None:
    """``calc[0].add(100)`` and ``calc.add.broadcast(7)`` without ``await`` send nothing: each
    says so when dropped, as Python does for a coroutine never awaited, naming the call and
    the line that made it. Before, both vanished without a word."""

    async def body() -> list[warnings.WarningMessage]:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("calc", Echo)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                mesh[0].record(100)  # forgotten: the line named below
                mesh.record.broadcast(7)  # forgotten too
                gc.collect()
                awaited = mesh[1].record(1)
                await awaited
                await otpmesh.gather(mesh[0].record(2), mesh[1].record(3))
                refused = mesh[0].record(4)
                with pytest.raises(otpmesh.MeshError, match="blocks its thread"):
                    refused.get()  # refused, and told why: no warning on top
                del awaited, refused
                gc.collect()
            assert await mesh[0].history() == [2]  # the forgotten calls were never sent
            return caught

    caught = run_trio(body)
    said = [(str(w.message), w.filename, w.lineno) for w in caught]
    assert [w.category for w in caught] == [RuntimeWarning, RuntimeWarning], said
    line = test_a_call_never_awaited_is_reported_with_its_actor_endpoint_and_line.__code__
    first = line.co_firstlineno
    assert "calc/0.record(...) was never awaited, so it was never sent" in said[0][0]
    assert "calc.record.broadcast(...) was never awaited" in said[1][0]
    assert said[0][1] == __file__ and said[1][1] == __file__
    assert said[0][2] == first + 11 and said[1][2] == first + 12
