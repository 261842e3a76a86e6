"""``app.view()``: the running tree as a rich tree (what a notebook cell shows): supervisors
with their strategy and intensity, children with status and incarnation, owned subtrees under
their owners."""

from __future__ import annotations

import pytest
from rich.console import Console

import otpmesh
from otpmesh import ONE_FOR_ALL, Mesh, Supervisor, Worker
from tests.conftest import run_trio
from tests.router_actors import Engine, Router


def _text(renderable: object) -> str:
    console = Console(width=120, record=True, file=None, force_terminal=False)
    with console.capture() as captured:
        console.print(renderable)
    return captured.get()


@pytest.mark.timeout(60)
def test_the_view_shows_every_level_with_its_settings_and_owned_subtrees() -> None:
    async def body() -> tuple[str, str]:
        tree = Supervisor(
            "svc",
            strategy=ONE_FOR_ALL,
            intensity=3,
            period=10.0,
            children=[Worker("router", Router), Mesh("pool", Engine, shape={"procs": 2})],
        )
        async with otpmesh.start(tree) as app:
            first = _text(app.view())
            await otpmesh.chaos.crash(app, "svc/pool/1")
            await app.settled()
            return first, _text(app.view())

    first, after = run_trio(body)
    lines = first.splitlines()
    assert lines[0].startswith("svc  one_for_all, intensity 3/10 s")
    assert any("router  Router  running" in line for line in lines)
    assert any(
        "engines  mesh 3 of Engine  one_for_one" in line and "(owned)" in line for line in lines
    )
    assert sum("Engine  running" in line for line in lines) == 5  # 3 owned, 2 in the pool
    assert "incarnation 2" not in first
    assert "incarnation 2" in after  # the ONE_FOR_ALL restart shows
