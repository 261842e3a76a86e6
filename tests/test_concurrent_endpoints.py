"""Concurrent endpoints (``@endpoint(concurrent=True)``): each call runs in its own task while
the actor takes its next message. Real worker processes; no assertion is about speed (the
fail_after guards only stop a test that would otherwise hang: serially, each of these waits
for ever)."""

from __future__ import annotations

import pytest
import trio

import otpmesh
from otpmesh import LogKind, Supervisor, Worker, chaos
from tests.conftest import run_trio
from tests.endpoint_actors import AioGather, Gather, Pinger, Progressing, Relay


@pytest.mark.parametrize("actor", [Gather, AioGather], ids=["trio", "asyncio"])
def test_ten_calls_in_flight_interleave_each_waiting_for_the_last(actor: type) -> None:
    """An asyncio actor runs them as asyncio tasks."""
    tree = Supervisor("s", children=[Worker("g", actor)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            g = app.actor("s/g")
            got: list[int] = []

            async def one(i: int) -> None:
                got.append(await g.meet(i, 10))

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in range(10):
                        nursery.start_soon(one, i)
            assert sorted(got) == list(range(10))

    run_trio(body, timeout=60)


def test_calls_start_in_mailbox_order_and_a_serial_endpoint_answers_while_they_wait() -> None:
    tree = Supervisor("s", children=[Worker("g", Gather)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            g = app.actor("s/g")
            for i in range(5):  # casts from one caller arrive in order
                await g.meet.broadcast(i, 6)
            with trio.fail_after(30):
                while await g.in_flight() < 5:  # served while five calls wait
                    await trio.sleep(0.01)
                assert await g.order() == [0, 1, 2, 3, 4]
                assert await g.meet(5, 6) == 5  # the sixth releases them all

    run_trio(body, timeout=60)


def test_a_cap_on_calls_in_flight_holds_the_rest_in_the_mailbox() -> None:
    tree = Supervisor("s", children=[Worker("g", Gather)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            g = app.actor("s/g")
            got: list[int] = []

            async def one(i: int) -> None:
                got.append(await g.pair(i))

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in range(5):  # two meet; the others pass once the event is set
                        nursery.start_soon(one, i)
                    while await g.in_flight() < 2:
                        await trio.sleep(0.01)
            assert sorted(got) == list(range(5))
            assert await g.in_flight() <= 5

    run_trio(body, timeout=60)


def test_reentrant_ping_pong_into_a_concurrent_endpoint_is_answered() -> None:
    tree = Supervisor("s", children=[Worker("a", Pinger), Worker("b", Pinger)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            a, b = app.actor("s/a"), app.actor("s/b")
            with trio.fail_after(30):  # a.ping (busy) -> b.pong -> a.ping_back (concurrent)
                assert await a.ping(b, a, "ping_back") == 1
                assert await a.ping(b, a, "ping_back") == 2

    run_trio(body, timeout=60)


@pytest.mark.parametrize("placement", ["procs", "local"])
def test_a_call_cycle_into_a_serial_endpoint_is_still_refused(placement: str) -> None:
    tree = Supervisor("s", intensity=10, children=[Worker("a", Pinger), Worker("b", Pinger)])

    async def body() -> None:
        async with otpmesh.start(tree, placement=placement) as app:  # type: ignore[arg-type]
            a, b = app.actor("s/a"), app.actor("s/b")
            with trio.fail_after(30), pytest.raises(otpmesh.ActorError) as info:
                await a.ping(b, a, "serial_back")
            assert "s/b raised DeadlockError" in str(info.value)  # and a, with b's error
            assert "call cycle s/a -> s/b -> s/a" in str(info.value)

    run_trio(body, timeout=60)


async def _holding(
    g: otpmesh.ActorRef, n: int, nursery: trio.Nursery
) -> list[otpmesh.ActorDiedError]:
    """Start `n` calls of g.hold (in flight until the actor ends) and wait until all are;
    the list fills with their callers' errors."""
    died: list[otpmesh.ActorDiedError] = []

    async def one() -> None:
        try:
            await g.hold()
        except otpmesh.ActorDiedError as err:
            died.append(err)

    for _ in range(n):
        nursery.start_soon(one)
    while await g.in_flight() < n:
        await trio.sleep(0.01)
    return died


def test_sigkill_with_ten_calls_in_flight_fails_every_caller_and_the_actor_restarts() -> None:
    tree = Supervisor("s", children=[Worker("g", Gather)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            g = app.actor("s/g")
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    errors = await _holding(g, 10, nursery)
                    stacks = await app.stacks("s/g")
                    assert stacks.actors["s/g"].count("concurrent endpoint hold:") == 10
                    await chaos.kill(app, "s/g")
            assert len(errors) == 10
            await app.settled()
            [exit_] = app.events.of_kind(LogKind.CHILD_EXITED)
            assert isinstance(exit_.reason, otpmesh.ProcessExit)
            assert await otpmesh.retry(g.in_flight) == 0  # a new incarnation

    run_trio(body, timeout=60)


def test_a_crash_in_one_call_ends_every_call_in_flight() -> None:
    tree = Supervisor("s", children=[Worker("g", Gather)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            g = app.actor("s/g")
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    died = await _holding(g, 3, nursery)
                    with pytest.raises(otpmesh.ActorError, match="boom in a concurrent call"):
                        await g.boom()
            assert len(died) == 3 and all(err.delivered is not False for err in died)
            await app.settled()
            [exit_] = app.events.of_kind(LogKind.CHILD_EXITED)
            assert isinstance(exit_.reason, otpmesh.ActorCrash)
            assert exit_.reason.endpoint == "boom"

    run_trio(body, timeout=60)


def test_a_caller_that_gives_up_cancels_its_call_only() -> None:
    tree = Supervisor("s", children=[Worker("g", Gather)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            g = app.actor("s/g")
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(g.meet, 0, 2)
                    while await g.in_flight() < 1:
                        await trio.sleep(0.01)
                    with trio.move_on_after(0.2):
                        await g.hold()  # given up: cancelled in the actor
                    while await g.in_flight() < 2:
                        await trio.sleep(0.01)
                    # meet(0) still waits: the third arrival (after hold's) releases it.
                    assert await g.meet(1, 3) == 1
            assert app.events.of_kind(LogKind.CHILD_EXITED) == []

    run_trio(body, timeout=60)


def test_a_hung_concurrent_call_makes_the_actor_exit_hung() -> None:
    tree = Supervisor("s", children=[Worker("p", Progressing, progress_deadline=1.0)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            p = app.actor("s/p")
            died: dict[str, str] = {}

            async def call(name: str, *args: int) -> None:
                try:
                    await p.endpoint(name)(*args)
                except otpmesh.ActorDiedError as err:
                    died[name] = str(err)

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, "steady", 10_000)  # progresses: not the hung one
                    nursery.start_soon(call, "stuck")
            assert "hung in stuck" in died["stuck"] and "hung in stuck" in died["steady"]
            await app.settled()
            [exit_] = app.events.of_kind(LogKind.CHILD_EXITED)
            assert isinstance(exit_.reason, otpmesh.Hung)
            assert exit_.reason.endpoint == "stuck"
            assert "at stuck (" in exit_.reason.stacks
            assert await otpmesh.retry(p.ping) == "pong"

    run_trio(body, timeout=60)


def test_a_concurrent_endpoint_may_reply_through_its_port() -> None:
    tree = Supervisor("s", children=[Worker("r", Relay)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            r = app.actor("s/r")
            got: list[int] = []

            async def one(x: int) -> None:
                got.append(await r.relay(x))

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for x in range(3):
                        nursery.start_soon(one, x)
                    await r.release()  # a serial call, answered while they wait
            assert sorted(got) == [0, 2, 4]

    run_trio(body, timeout=60)


def test_concurrent_on_a_plain_def_is_a_type_error_that_says_what_to_write() -> None:
    with pytest.raises(TypeError, match=r"write 'async def step\(...\)'.*blocking=True"):

        class Bad(otpmesh.Actor):
            @otpmesh.endpoint(concurrent=True)
            def step(self) -> None: ...

    with pytest.raises(ValueError, match=r"concurrent=0.*positive int"):
        otpmesh.endpoint(concurrent=0)
