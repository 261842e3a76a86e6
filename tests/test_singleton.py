"""Singletons are typed (issue 39, item 6): ``singletons/NAME`` keeps the class of its first
request, and a request for another class raises, from the controller and from a worker, also
after the singleton restarted and after its supervisor gave up.

Real worker processes; waits poll for a state under a deadline, no timing assertions."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

import otpmesh
from otpmesh import Supervisor, Worker
from tests.conftest import run_trio
from tests.owned_actors import Finder, Replica

REPLICA = "tests.owned_actors:Replica"
FINDER = "tests.owned_actors:Finder"
#: What a request for the wrong class is told: both classes, and what to write instead.
WRONG_CLASS = (
    f"singletons/registry is a {REPLICA}, not a {FINDER}: a singleton keeps the class of its "
    f"first request while the controller runs; ask for {REPLICA}, or give yours another name"
)


async def _until(check: Callable[[], Awaitable[Any]], timeout: float = 20.0) -> Any:
    """Poll `check()` until it answers something truthy (an actor restarting: not yet)."""
    with trio.fail_after(timeout):
        while True:
            try:
                found = await check()
                if found:
                    return found
            except (otpmesh.ActorDiedError, otpmesh.CallTimeoutError):
                pass
            await trio.sleep(0.02)


@pytest.mark.timeout(60)
def test_a_singleton_asked_for_as_another_class_raises_naming_both_and_the_same_class_shares() -> (
    None
):
    async def body() -> None:
        tree = Supervisor("top", children=[Worker("finder", Finder)])
        async with otpmesh.start(tree) as app:
            finder = app.actor("top/finder")
            # A worker asks first: its class and its arguments are the singleton's.
            first = await finder.singleton_of("registry", REPLICA, "single")
            assert first[:3] == ["singletons/registry", first[1], "single"]
            again = await otpmesh.singleton("registry", Replica, "the controller's own")
            assert (await again.who())[:3] == first[:3]  # the same actor; these args ignored
            with pytest.raises(otpmesh.SingletonError, match=WRONG_CLASS):
                await otpmesh.singleton("registry", Finder, "a secret for the registry")
            # From a worker too, as the same error (it crossed the wire as data).
            assert await finder.singleton_of("registry", FINDER) == ["SingletonError", WRONG_CLASS]
            assert (await again.who())[:3] == first[:3]  # and the singleton is untouched

    run_trio(body)


@pytest.mark.timeout(60)
def test_a_singletons_class_stays_bound_after_it_restarts_and_after_its_supervisor_gave_up() -> (
    None
):
    async def body() -> None:
        tree = Supervisor("top", children=[Worker("finder", Finder)])
        async with otpmesh.start(tree) as app:
            ref = await otpmesh.singleton("registry", Replica, "single")
            assert (await ref.who())[2:] == ["single", 1]
            with pytest.raises(otpmesh.ActorError, match="replica crashed on purpose"):
                await ref.crash()
            # Restarted: a new instance, whose first answer is its call 1 again.
            assert (await _until(ref.who))[2:] == ["single", 1]
            with pytest.raises(otpmesh.SingletonError, match=WRONG_CLASS):
                await otpmesh.singleton("registry", Finder)
            await _crash_until_its_supervisor_gives_up(ref)
            with pytest.raises(otpmesh.SingletonError, match=WRONG_CLASS):
                await otpmesh.singleton("registry", Finder)
            finder = app.actor("top/finder")
            assert await finder.singleton_of("registry", FINDER) == ["SingletonError", WRONG_CLASS]
            # The next request of its class starts it again, as it first was (its arguments).
            fresh = await otpmesh.singleton("registry", Replica, "late")
            assert (await fresh.who())[::2] == ["singletons/registry", "single"]

    run_trio(body)


async def _crash_until_its_supervisor_gives_up(ref: otpmesh.ActorRef) -> None:
    """Crash the singleton as soon as it is back, until ``singletons`` gives up (10 restarts
    in 10 s): then nothing is left at its path."""
    with trio.fail_after(30):
        while True:
            try:
                await otpmesh.lookup("singletons/registry")
            except KeyError:
                return  # the singletons' supervisor gave up
            try:
                await ref.crash()
            except otpmesh.ActorError:
                continue  # it crashed (and restarts)
            except (otpmesh.ActorDiedError, otpmesh.CallTimeoutError):
                await trio.sleep(0.02)  # restarting: not back yet
