"""asyncio code in endpoints: an actor declared with ``loop="asyncio"`` runs its async code as
asyncio tasks (an engine's background loop, asyncio streams), with progress deadlines,
cancellation, stacks, calls to other actors and the serial mailbox still working. Real worker
processes throughout; the guards only stop a test that would otherwise hang."""

from __future__ import annotations

import pytest
import trio

import otpmesh
from otpmesh import LogKind, Supervisor, Worker
from tests.aio_actors import Rollout, TrioActor
from tests.conftest import run_trio


@pytest.mark.parametrize("placement", ["procs", "local"])
def test_an_asyncio_actor_awaits_an_engine_and_an_http_client(placement: str) -> None:
    tree = Supervisor("s", children=[Worker("a", Rollout), Worker("b", Rollout)])

    async def body() -> None:
        async with otpmesh.start(tree, placement=placement) as app:  # type: ignore[arg-type]
            a, b = app.actor("s/a"), app.actor("s/b")
            assert await a.loop_and_path() == ["_UnixSelectorEventLoop", "s/a"]
            assert await a.generate("hello") == "HELLO"
            # Many at once: the mailbox still serves them one at a time, all answered.
            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(a.generate, f"p{i}")
            assert await a.fetch("/weights") == "you asked for /weights"
            # From asyncio code, a call to another actor goes through otpmesh as usual.
            assert await a.ask(b, "from a") == "FROM A"

    run_trio(body, timeout=60)


def test_a_progress_deadline_cuts_a_stuck_asyncio_await_and_restarts_with_its_stack() -> None:
    tree = Supervisor("s", children=[Worker("a", Rollout, progress_deadline=0.5)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            a = app.actor("s/a")
            with trio.fail_after(30), pytest.raises(otpmesh.ActorDiedError, match="stuck"):
                await a.stuck()
            await app.settled()
            [reason] = [e.reason for e in app.events.of_kind(LogKind.CHILD_EXITED)]
            assert isinstance(reason, otpmesh.Hung)
            assert reason.endpoint == "stuck"
            assert "ran past its progress deadline" in reason.how  # cancelled, not killed
            assert "at stuck (" in reason.stacks and "aio_actors.py" in reason.stacks
            assert await a.generate("again") == "AGAIN"  # restarted: a new engine

    run_trio(body, timeout=60)


def test_a_callers_timeout_and_cancel_reach_the_asyncio_task() -> None:
    tree = Supervisor("s", children=[Worker("a", Rollout)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            a = app.actor("s/a")
            with pytest.raises(otpmesh.CallTimeoutError):
                await a.with_timeout(0.3).slow("timed out")
            with trio.move_on_after(0.3):
                await a.slow("cancelled")
            with trio.fail_after(30):  # a guard: without cancellation they never come
                while await a.cancelled_calls() != ["timed out", "cancelled"]:
                    await trio.sleep(0.02)
            assert await a.generate("still here") == "STILL HERE"
            assert not app.events.of_kind(LogKind.CHILD_EXITED)  # not a crash

    run_trio(body, timeout=60)


def test_stacks_show_an_asyncio_endpoint_and_stop_from_asyncio_code_is_orderly() -> None:
    tree = Supervisor("s", children=[Worker("a", Rollout, restart=otpmesh.TRANSIENT)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            a = app.actor("s/a")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.slow, "watched")
                with trio.fail_after(30):
                    while "at slow (" not in (stacks := await app.stacks()).actors["s/a"]:
                        await trio.sleep(0.02)
                assert "async endpoint slow:" in stacks.actors["s/a"]
                nursery.cancel_scope.cancel()
            assert await a.stop_me() == "stopping"
            await app.settled()
            [exited] = app.events.of_kind(LogKind.CHILD_EXITED)
            assert exited.reason == "normal"

    run_trio(body, timeout=60)


def test_a_trio_actor_that_awaits_asyncio_is_told_how_to_ask_for_it() -> None:
    tree = Supervisor("s", children=[Worker("t", TrioActor)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            with pytest.raises(otpmesh.ActorError, match="no running event loop") as caught:
                await app.actor("s/t").nap()
            assert 'loop="asyncio"' in str(caught.value)

    run_trio(body, timeout=60)


def test_an_unknown_loop_is_refused_when_the_class_is_defined() -> None:
    with pytest.raises(ValueError, match="loop must be one of 'trio', 'asyncio'"):

        class Bad(otpmesh.Actor, loop="uvloop"):  # type: ignore[call-arg]
            pass
