"""BaseExceptions raised by an actor's own code (not Exceptions: a BaseException subclass,
KeyboardInterrupt, GeneratorExit, SystemExit) end that actor only, never its worker process
and the other actors in it; the runtime's own cancellation still goes through."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import otpmesh
from otpmesh import LogKind, Supervisor, Worker
from tests.actors import Echo
from tests.conftest import run_trio
from tests.ending_actors import Raiser

# (endpoint, kind of BaseException, the remote type the caller sees)
CRASHES = [
    ("raise_async", "boom", "Boom"),
    ("raise_sync", "boom", "Boom"),
    ("raise_async", "keyboard", "KeyboardInterrupt"),
    ("raise_sync", "generator", "GeneratorExit"),
    ("raise_in_nursery", "boom", "BaseExceptionGroup"),
    ("raise_async", "exit3", "SystemExit"),
]


async def _keeper_and_raiser(procs: otpmesh.ProcMesh, **kw: Any) -> tuple[Any, Any, int]:
    """An unsupervised actor holding state, and a supervised Raiser, in the same process."""
    keeper = await procs.spawn("keeper", Echo)
    raiser = await procs.spawn_supervised("raiser", Raiser, intensity=20, period=600.0, **kw)
    await keeper[0].record("state")
    pid = await keeper[0].pid()
    assert await raiser[0].pid() == pid
    return keeper[0], raiser[0], pid


def test_a_base_exception_from_an_endpoint_ends_that_actor_only_and_it_restarts_in_place() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper, raiser, pid = await _keeper_and_raiser(procs)
            for endpoint, kind, type_name in CRASHES:
                with pytest.raises(otpmesh.ActorError, match=f"raised {type_name}") as caught:
                    await raiser.endpoint(endpoint)(kind)
                assert caught.value.type_name == type_name
                assert await raiser.pid() == pid  # restarted inside the same, live process
            # sys.exit(0) stops it normally: its caller hears it stopped; still restarted
            # (a PERMANENT child), as after any exit.
            with pytest.raises(otpmesh.ActorDiedError, match=r"stopped \(normal\)"):
                await raiser.raise_sync("exit0")
            assert await raiser.pid() == pid
            assert await keeper.history() == ["state"]  # the sibling kept its state
            app = procs.supervision("raiser")
            await app.settled()
            reasons = [e.reason for e in app.events.of_kind(LogKind.CHILD_EXITED)]
            assert [(r.type_name, r.endpoint) for r in reasons[:-1]] == [
                (type_name, endpoint) for endpoint, kind, type_name in CRASHES
            ]
            assert reasons[-1] == "normal"
            assert "Boom: not an Exception" in reasons[0].traceback
            assert not app.events.of_kind(LogKind.START_FAILED)
            assert len(app.events.of_kind(LogKind.CHILD_STARTED)) == len(CRASHES) + 2

    run_trio(body)


def test_a_base_exception_from_a_constructor_or_on_start_fails_that_start_only() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper, _raiser, pid = await _keeper_and_raiser(procs)
            for at in ("init", "on_start"):
                with pytest.raises(otpmesh.SpawnError, match="raised Boom: not an Exception"):
                    await procs.spawn(f"bad_{at}", Raiser, at)
            # on_stop raising too: the actor still ends with its crash, and is restarted.
            stopper = await procs.spawn_supervised("stopper", Raiser, args=("on_stop",))
            with pytest.raises(otpmesh.ActorError, match="raised KeyboardInterrupt"):
                await stopper[0].raise_async("keyboard")
            assert await stopper[0].pid() == pid
            assert await keeper.history() == ["state"]
            (exit_,) = procs.supervision("stopper").events.of_kind(LogKind.CHILD_EXITED)
            assert isinstance(exit_.reason, otpmesh.ActorCrash)
            assert exit_.reason.type_name == "KeyboardInterrupt"

    run_trio(body)


def test_a_supervised_start_that_raises_a_base_exception_is_a_start_failure() -> None:
    tree = Supervisor("s", children=[Worker("a", Raiser, args=("init",))])

    async def body() -> None:
        with pytest.raises(otpmesh.SupervisorError) as caught:
            async with otpmesh.start(tree):
                pass
        reason = caught.value.reason
        assert isinstance(reason, tuple)
        crash = reason[1][2]
        assert isinstance(crash, otpmesh.ActorCrash) and crash.type_name == "Boom"
        assert "in __init__" in crash.traceback and "_host.py" not in crash.traceback

    run_trio(body)


def test_in_the_controllers_own_process_keyboard_interrupt_is_ctrl_c_and_goes_on() -> None:
    tree = Supervisor("s", children=[Worker("a", Raiser)])

    async def body() -> None:
        async with otpmesh.start(tree, placement="local") as app:
            await app.actor("s/a").raise_async("keyboard")

    with pytest.raises(BaseException) as caught:
        run_trio(body)
    exc = caught.value
    if isinstance(exc, BaseExceptionGroup):
        found, _ = exc.split(KeyboardInterrupt)
        assert found is not None, exc
    else:
        assert isinstance(exc, KeyboardInterrupt), exc


def test_a_crash_from_outside_an_endpoint_waiting_in_its_own_nursery_answers_its_caller() -> None:
    """The cancellation reaches the endpoint as a group of Cancelled (one per task of its
    nursery): it is the runtime's, and its caller still hears the actor died."""
    tree = Supervisor("s", children=[Worker("a", Raiser)], intensity=3)

    async def body() -> None:
        async with otpmesh.start(tree, placement="local") as app:
            ref = app.actor("s/a")
            outcome: list[BaseException] = []

            async def call() -> None:
                try:
                    await ref.wait_in_nursery()
                except otpmesh.ActorDiedError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                await trio.testing.wait_all_tasks_blocked()
                await otpmesh.chaos.crash(app, "s/a")
            (died,) = outcome
            assert died.delivered and "ChaosCrash" in died.reason

    run_trio(body, timeout=20)
