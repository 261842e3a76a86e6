"""Refs by path follow restarts at every level: a ref into a subtree an actor owns, taken
before its owner died, reaches the subtree its owner's next incarnation starts (real
processes, a real SIGKILL)."""

from __future__ import annotations

import os
import signal

import pytest
import trio

import otpmesh
from otpmesh import Supervisor, Worker
from tests.conftest import run_trio
from tests.router_actors import Router


@pytest.mark.timeout(120)
def test_an_old_ref_into_an_owned_subtree_reaches_it_after_its_owner_restarts() -> None:
    """Before, the old ref failed for good ('its supervisor svc/router/engines exited (stopped
    (shutdown))', 341 times over 2.2 s in the report) while a fresh app.mesh(...) worked."""

    async def body() -> None:
        tree = Supervisor("svc", intensity=5, period=60.0, children=[Worker("router", Router)])
        async with otpmesh.start(tree) as app:
            router = app.actor("svc/router")
            before = await router.pids()
            engines = app.mesh("svc/router/engines")  # taken now, kept across the restart
            assert list((await engines.pid()).values()) == before[1:]
            os.kill(before[0], signal.SIGKILL)  # the owner dies: its engines are stopped
            with trio.fail_after(60):
                now = before
                while now[0] == before[0]:  # until the router is back, with new engines
                    await trio.sleep(0.05)
                    try:
                        now = await router.pids()
                    except (otpmesh.ActorError, otpmesh.ActorDiedError):
                        continue
                after = list((await engines.pid()).values())
            assert after == now[1:] and not set(after) & set(before[1:])

    run_trio(body, timeout=90)
