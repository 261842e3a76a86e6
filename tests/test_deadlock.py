"""Deadlocks refused: a call that would wait on itself fails at once, naming the cycle (OTP's
gen_server:call refuses calling_self). Without the check each of these calls hangs forever;
the fail_after is only a guard."""

from __future__ import annotations

import pytest
import trio

import otpmesh
from otpmesh import Mesh, Supervisor
from tests.actors import Caller
from tests.conftest import run_trio

TREE = Supervisor("s", intensity=10, children=[Mesh("c", Caller, shape={"procs": 2})])


@pytest.mark.parametrize("placement", ["procs", "local"])
def test_a_call_to_itself_fails_at_once_naming_the_actor(placement: str) -> None:
    async def body() -> None:
        async with otpmesh.start(TREE, placement=placement) as app:  # type: ignore[arg-type]
            c = app.mesh("s/c")
            with trio.fail_after(30):
                with pytest.raises(otpmesh.ActorError) as info:
                    await c[0].call(c[0])
            assert info.value.type_name == "DeadlockError"
            assert "call cycle s/c/0 -> s/c/0" in str(info.value)
            await app.settled()
            assert await otpmesh.retry(c[0].call, c[1]) == "s/c/1"  # A -> B is fine

    run_trio(body, timeout=60)


@pytest.mark.parametrize("placement", ["procs", "local"])
def test_a_call_back_around_a_cycle_fails_at_once_naming_the_cycle(placement: str) -> None:
    async def body() -> None:
        async with otpmesh.start(TREE, placement=placement) as app:  # type: ignore[arg-type]
            c = app.mesh("s/c")
            with trio.fail_after(30):
                with pytest.raises(otpmesh.ActorError) as info:
                    await c[0].via(c[1], c[0])  # s/c/0 -> s/c/1 -> s/c/0
            assert "call cycle s/c/0 -> s/c/1 -> s/c/0" in str(info.value)

    run_trio(body, timeout=60)


def test_a_chain_without_a_cycle_is_answered() -> None:
    """No false alarm: s/c/0 -> s/c/1 -> s/c/2 passes through three busy actors, none twice."""
    three = Supervisor("s", children=[Mesh("c", Caller, shape={"procs": 3})])

    async def body() -> None:
        async with otpmesh.start(three, placement="local") as app:
            c = app.mesh("s/c")
            assert await c[0].via(c[1], c[2]) == "s/c/2"
            assert await c[1].via(c[0], c[2]) == "s/c/2"

    run_trio(body, timeout=60)
