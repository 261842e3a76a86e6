"""1,000 idle worker processes on this machine: no false "hung" kill while they sit for a minute,
and one SIGSTOPped among them is still found, as stopped, at the heartbeat timeout.

Slow and opt-in (``pytest -m slow tests/test_thousand_idle.py``): about three minutes on two
cores. The fork server preloads nothing (``OTPMESH_PRELOAD=""``): these workers need no torch,
and a thousand of them fit in memory that way.
"""

from __future__ import annotations

import time

import pytest
import trio

import otpmesh
from otpmesh import LogKind, Mesh, Supervisor, chaos
from otpmesh._runtime._proc import HEARTBEAT_TIMEOUT
from tests.actors import Echo

PROCS = 1000
GROUPS = 10  # forked 100 at a time: one mesh after another, as the root starts them in order
IDLE = 60.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_a_thousand_idle_workers_have_no_false_hang_and_a_stopped_one_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTPMESH_PRELOAD", "")
    size = PROCS // GROUPS
    tree = Supervisor(
        "idle",
        children=[Mesh(f"g{g}", Echo, shape={"procs": size}) for g in range(GROUPS)],
    )
    victim = "idle/g3/42"
    report: dict[str, float] = {}

    async def body() -> None:
        begun = time.monotonic()
        async with otpmesh.start(tree) as app:
            report["start_s"] = time.monotonic() - begun
            await trio.sleep(IDLE)  # the whole minute: any exit now is a false one
            assert app.events.of_kind(LogKind.CHILD_EXITED) == []
            answers = await app.mesh("idle/g9").echo("still here")
            assert set(answers.values()) == {"still here"}
            stopped = time.monotonic()
            await chaos.hang(app, victim)
            with trio.fail_after(30 * HEARTBEAT_TIMEOUT):  # a hang guard: 10x is "running"
                while not app.events.of_kind(LogKind.CHILD_EXITED):
                    await trio.sleep(0.05)
            report["found_s"] = time.monotonic() - stopped
            (exit_,) = app.events.of_kind(LogKind.CHILD_EXITED)
            assert exit_.child_path == victim
            # Judged as stopped, which happens at the timeout (a live process would get 10x).
            assert "hung (stopped:" in otpmesh.describe(exit_.reason)
            await app.settled()
            stopping = time.monotonic()
        report["stop_s"] = time.monotonic() - stopping
        exits = [e.child_path for e in app.events.of_kind(LogKind.CHILD_EXITED)]
        assert exits == [victim]  # nothing else exited by itself, before or after

    trio.run(body)  # pytest-timeout (above) guards the whole run
    print(
        f"\n{PROCS} idle workers: started in {report['start_s']:.1f} s, idle {IDLE:g} s with no "
        f"false hang; SIGSTOPped one found in {report['found_s']:.2f} s (heartbeat timeout "
        f"{HEARTBEAT_TIMEOUT:g} s); stopped all in {report['stop_s']:.1f} s"
    )
