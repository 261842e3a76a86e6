"""Reductions over a mesh's replies, on the caller's side, as they arrive (``ep.reduce``)."""

from __future__ import annotations

import operator
import os
import signal

import pytest
import trio

import otpmesh
from otpmesh import LogKind
from tests.actors import Echo
from tests.conftest import run_trio


@pytest.mark.timeout(60)
def test_reduce_combines_every_reply_of_a_mesh_of_4() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=4) as procs:
            mesh = await procs.spawn("w", Echo)
            assert await mesh.echo.reduce(operator.add, 0)(5) == 20
            ranks = await mesh.whoami.reduce(lambda acc, v: acc | {v["rank"]}, frozenset())()
            assert ranks == {0, 1, 2, 3}
            # The reduction's own settings never come from the endpoint's arguments.
            assert await mesh.echo.reduce(operator.add, "")(x="ab") == "abababab"
            with pytest.raises(otpmesh.ActorError, match="boom"):
                await mesh.slice(procs=slice(0, 2)).fail.reduce(operator.add, 0)("boom")
            with pytest.raises(TypeError, match="reduce\\(combine, initial\\) needs a function"):
                mesh.echo.reduce(0, operator.add)  # type: ignore[arg-type]

    run_trio(body)


@pytest.mark.timeout(90)
def test_a_reduction_over_a_mesh_with_one_member_restarting_reduces_all_4() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=4) as procs:
            mesh = await procs.spawn_supervised("w", Echo, intensity=5)
            group = procs.supervision("w")
            victim = (await mesh[2].whoami())["pid"]
            os.kill(victim, signal.SIGKILL)
            while not any(e.kind == LogKind.CHILD_EXITED for e in group.events):
                await trio.sleep(0.01)  # the exit is noticed: the member is restarting now
            ranks = await mesh.whoami.reduce(lambda acc, v: [*acc, (v["rank"], v["pid"])], [])()
            assert sorted(r for r, _ in ranks) == [0, 1, 2, 3]
            assert dict(ranks)[2] != victim  # answered by the next incarnation

    run_trio(body)
