"""What an endpoint's exception does, per endpoint: crash the actor (the default, OTP's let it
crash) or reply it to the caller (``let_it_crash=False``: the actor keeps its state), set per
endpoint or for a whole class; calls and broadcasts follow the same policy."""

from __future__ import annotations

import pytest
import trio

import otpmesh
from otpmesh import LogKind, Mesh, Supervisor, Worker
from tests.conftest import run_trio
from tests.endpoint_actors import Answerable, Counter, Lenient


def test_a_class_level_policy_applies_to_every_endpoint_that_does_not_say() -> None:
    infos = Lenient.endpoints()
    assert infos["bump"].let_it_crash is False and infos["fail"].let_it_crash is False
    assert infos["strict"].let_it_crash is True  # its own word wins
    assert Counter.endpoints()["bump"].let_it_crash is None  # none said: the default decides
    tree = Supervisor("s", children=[Worker("l", Lenient)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            lenient = app.actor("s/l")
            with trio.fail_after(30):
                with pytest.raises(otpmesh.ActorError, match="lenient fail") as info:
                    await lenient.fail()
                assert info.value.type_name == "ValueError"
                assert "in fail" in info.value.traceback
                assert await lenient.bump() == 2  # alive, with its state
                with pytest.raises(otpmesh.ActorError, match="strict fail"):
                    await lenient.strict()
                await app.settled()
                assert await otpmesh.retry(lenient.bump) == 1  # crashed and restarted
            [exit_] = app.events.of_kind(LogKind.CHILD_EXITED)
            assert isinstance(exit_.reason, otpmesh.ActorCrash)
            assert exit_.reason.endpoint == "strict"

    run_trio(body, timeout=60)


def test_a_broadcast_to_a_reply_policy_endpoint_that_raises_leaves_the_actor_alive() -> None:
    tree = Supervisor("s", children=[Mesh("c", Counter, shape={"procs": 2})])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            counters = app.mesh("s/c")
            with trio.fail_after(30):
                await counters.bump()
                await counters.soft.broadcast()  # each raises; logged, nobody to tell
                assert list((await counters.bump()).values()) == [3, 3]  # state kept
                with pytest.raises(otpmesh.ActorError, match="soft fail"):
                    await counters.soft()  # a call gets the exception
                assert list((await counters.bump()).values()) == [5, 5]
            assert app.events.of_kind(LogKind.CHILD_EXITED) == []

    run_trio(body, timeout=60)


@pytest.mark.parametrize("how", ["call", "broadcast"])
def test_a_call_or_broadcast_to_a_crash_policy_endpoint_restarts_the_actor(how: str) -> None:
    tree = Supervisor("s", children=[Worker("c", Counter)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            counter = app.actor("s/c")
            with trio.fail_after(30):
                assert await counter.bump() == 1
                if how == "call":
                    with pytest.raises(otpmesh.ActorError, match="hard fail"):
                        await counter.hard()
                else:
                    await counter.hard.broadcast()
                await app.settled()
                assert await otpmesh.retry(counter.bump) == 1  # a new incarnation
            [exit_] = app.events.of_kind(LogKind.CHILD_EXITED)
            assert isinstance(exit_.reason, otpmesh.ActorCrash)

    run_trio(body, timeout=60)


def test_a_policy_that_is_not_one_is_refused_with_what_to_write() -> None:
    with pytest.raises(TypeError, match=r"let_it_crash='no'.*expected True .* or 'unanswered'"):

        class Bad(otpmesh.Actor, let_it_crash="no"):  # type: ignore[call-arg]
            pass

    with pytest.raises(TypeError, match=r"let_it_crash=0.*expected True, False or 'unanswered'"):
        otpmesh.endpoint(let_it_crash=0)  # type: ignore[call-overload]


def test_unanswered_replies_a_calls_exception_and_crashes_on_a_broadcasts() -> None:
    tree = Supervisor("s", children=[Mesh("a", Answerable, shape={"procs": 2})])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("s/a")
            with trio.fail_after(30):
                with pytest.raises(otpmesh.ActorError, match="picky fail"):
                    await mesh[0].picky()
                assert await mesh[0].bump() == 2  # a caller heard of it: the actor lives
                assert app.events.of_kind(LogKind.CHILD_EXITED) == []
                await mesh.picky.broadcast()  # nobody hears of these: both actors crash
                while len(app.events.of_kind(LogKind.CHILD_EXITED)) < 2:
                    await trio.sleep(0.01)
                await app.settled()
                assert list((await mesh.bump()).values()) == [1, 1]  # fresh incarnations

    run_trio(body, timeout=60)
