"""The default error policy does not cascade (real processes, real SIGKILLs): a callee's
death that escapes an endpoint is its caller's news, not a fault of the actor in between, and
an actor nothing will restart is not killed by an exception its caller hears of; a supervised
actor's own exception still crashes it (tests/test_app.py and others)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

import otpmesh
from otpmesh import Supervisor, Worker
from tests.conftest import run_trio
from tests.router_actors import Calc, Router


@pytest.mark.timeout(120)
def test_a_router_with_no_policy_loses_only_the_killed_engines_request(tmp_path: Path) -> None:
    """Before, the router crashed with the ActorDiedError of the engine it called (the
    default policy crashed on any exception), and as their owner its crash restarted all
    three engines: new pids for all, their warm state and the router's other requests lost."""
    marker = tmp_path / "reached"

    async def body() -> None:
        tree = Supervisor("svc", children=[Worker("router", Router)])
        async with otpmesh.start(tree) as app:
            router = app.actor("svc/router")
            before = await router.pids()
            outcome: list[BaseException] = []

            async def request() -> None:
                try:
                    await router.route(1, 60.0, str(marker))
                except (otpmesh.ActorError, otpmesh.ActorDiedError) as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(request)
                with trio.fail_after(30):
                    while not marker.exists():
                        await trio.sleep(0.02)
                os.kill(int(marker.read_text()), signal.SIGKILL)  # mid-request
            assert len(outcome) == 1 and "ActorDiedError" in repr(outcome[0]) + str(outcome[0])
            await app.settled()
            with trio.fail_after(30):
                while True:  # the killed engine comes back in a new process
                    after = await router.pids()
                    if after[2] != before[2]:
                        break
                    await trio.sleep(0.05)
            assert after[:2] == before[:2] and after[3] == before[3]  # router, engines 0 and 2
            assert app.which_children("svc")[0].incarnation == 1  # the router never crashed
            assert await router.route(0, 0.0) == before[1]  # and serves on

    run_trio(body, timeout=90)


@pytest.mark.timeout(60)
def test_an_unsupervised_actor_lives_through_an_exception_its_caller_hears_of() -> None:
    """Before, ``calc[0].add("x")`` killed the actor for good ('calc/0 (unsupervised) exited:
    crashed with TypeError ...; it will not be restarted'), as Ray and Monarch do not."""

    async def body() -> int:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            calc = await procs.spawn("calc", Calc)
            await calc[0].add(1)
            with pytest.raises(otpmesh.ActorError, match=r"TypeError|unsupported operand"):
                await calc[0].add("x")
            return int(await calc[0].add(2))  # the same actor, its state kept

    assert run_trio(body) == 3
