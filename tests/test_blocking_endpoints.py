"""Blocking endpoints (``@endpoint(blocking=True)``): a plain def run in a worker thread, one
call at a time, that may block and may call other actors through ``trio.from_thread.run``.
Real worker processes; the fail_after guards only stop a test that would otherwise hang."""

from __future__ import annotations

import pytest
import trio

import otpmesh
from otpmesh import LogKind, Supervisor, Worker
from tests.actors import Echo
from tests.conftest import run_trio
from tests.endpoint_actors import Asker, Blocker

TREE = Supervisor(
    "s",
    intensity=10,
    children=[Worker("b", Blocker), Worker("e", Echo), Worker("a", Asker)],
)


@pytest.mark.parametrize("placement", ["procs", "local"])
def test_a_blocking_endpoint_calls_another_actor_from_its_thread(placement: str) -> None:
    async def body() -> None:
        async with otpmesh.start(TREE, placement=placement) as app:  # type: ignore[arg-type]
            b, e = app.actor("s/b"), app.actor("s/e")
            with trio.fail_after(30):
                assert await b.ask(e, {"x": 1}) == {"x": 1}
                assert await b.ping() == "pong"  # the actor serves on

    run_trio(body, timeout=60)


@pytest.mark.parametrize("placement", ["procs", "local"])
def test_a_blocking_endpoint_calling_back_into_its_caller_is_refused(placement: str) -> None:
    async def body() -> None:
        async with otpmesh.start(TREE, placement=placement) as app:  # type: ignore[arg-type]
            a, b = app.actor("s/a"), app.actor("s/b")
            with trio.fail_after(30), pytest.raises(otpmesh.ActorError) as info:
                await a.around(b, a)  # s/a -> s/b (in its thread) -> s/a
            assert "s/b raised DeadlockError" in str(info.value)
            assert "call cycle s/a -> s/b -> s/a" in str(info.value)

    run_trio(body, timeout=60)


def test_context_progress_and_stop_work_from_the_thread() -> None:
    async def body() -> None:
        async with otpmesh.start(TREE) as app:
            b = app.actor("s/b")
            with trio.fail_after(30):
                assert await b.where() == {"path": "s/b", "chain_ok": True}
                assert await b.finish() == "stopping"  # self.stop() from the thread
                await app.settled()
            [exit_] = app.events.of_kind(LogKind.CHILD_EXITED)
            assert exit_.reason == "normal"
            assert await otpmesh.retry(b.ping) == "pong"  # permanent: started again

    run_trio(body, timeout=60)


def test_progress_from_the_thread_keeps_it_alive_and_a_wedged_one_exits_hung() -> None:
    # A deadline with room: a thread held off the CPU that long by other work is not "wedged"
    # (at 2 s, a full suite beside other jobs failed it once).
    tree = Supervisor("s", children=[Worker("b", Blocker, progress_deadline=4.0)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            b = app.actor("s/b")
            with trio.fail_after(30):
                assert await b.nap(100) == 100  # 5 s in all, never 4 s without progress
                with pytest.raises(otpmesh.ActorDiedError, match="hung in wedge"):
                    await b.wedge()
                await app.settled()
            [exit_] = app.events.of_kind(LogKind.CHILD_EXITED)
            assert isinstance(exit_.reason, otpmesh.Hung)
            assert "blocking endpoint wedge:" in exit_.reason.stacks
            assert "at wedge (" in exit_.reason.stacks

    run_trio(body, timeout=60)


def test_blocking_on_an_async_def_is_a_type_error_that_says_what_to_write() -> None:
    with pytest.raises(TypeError, match=r"async def step.*drop blocking=True"):

        class Bad(otpmesh.Actor):
            @otpmesh.endpoint(blocking=True)
            async def step(self) -> None: ...
