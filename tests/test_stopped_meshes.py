"""A controller that spawns and stops meshes for days keeps nothing of the stopped ones."""

from __future__ import annotations

import otpmesh
from otpmesh._runtime._controller_runtime import runtime
from tests.actors import Echo
from tests.conftest import run_trio


def test_stopped_actor_and_proc_meshes_leave_no_exit_listener_behind() -> None:
    async def body() -> None:
        rt = await runtime()
        before = set(rt.exit_listeners)
        for round in range(3):
            procs = await otpmesh.proc_mesh(procs=2)
            kept = await procs.spawn(f"kept{round}", Echo)
            stopped = await procs.spawn(f"stopped{round}", Echo)
            await procs.slice(procs=1).spawn(f"sliced{round}", Echo)
            assert (await kept.echo.call(round)).values() == [round, round]
            await stopped.stop()
            assert not [p for p in rt.exit_listeners if p.startswith(f"stopped{round}")]
            await procs.stop()
        assert set(rt.exit_listeners) == before

    run_trio(body)
