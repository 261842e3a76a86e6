"""A worker that stops in order runs its atexit functions and finalizers (a SIGKILLed one runs
nothing); of those its fork server registered, the atexit functions run and the finalizers of
the server's own objects do not (otpmesh/_runtime/_exitfuncs.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import otpmesh
from tests.conftest import run_trio
from tests.ending_actors import Tidy


def _files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def test_a_graceful_proc_mesh_stop_runs_the_workers_atexit_functions_and_finalizers(
    tmp_path: Path,
) -> None:
    async def body() -> list[int]:
        procs = await otpmesh.proc_mesh(procs=2)
        tidy = await procs.spawn("tidy", Tidy)
        pids = (await tidy.register_exit(str(tmp_path))).values()
        await procs.stop()
        return pids

    pids = run_trio(body)
    assert _files(tmp_path) == {f"{kind}-{pid}" for pid in pids for kind in ("atexit", "finalizer")}


def test_a_sigkilled_worker_runs_no_exit_functions(tmp_path: Path) -> None:
    async def body() -> None:
        procs = await otpmesh.proc_mesh(procs=1)
        tidy = await procs.spawn("tidy", Tidy)
        (pid,) = (await tidy.register_exit(str(tmp_path))).values()
        os.kill(pid, signal.SIGKILL)
        await procs.stop()

    run_trio(body)
    assert _files(tmp_path) == set()


def test_of_what_the_fork_server_registered_workers_run_atexit_functions_not_finalizers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTPMESH_PRELOAD", "tests.exit_preload")
    monkeypatch.setenv("OTPMESH_TEST_EXIT_DIR", str(tmp_path))

    async def body() -> list[int]:
        procs = await otpmesh.proc_mesh(procs=2)
        pids = (await (await procs.spawn("tidy", Tidy)).register_exit(str(tmp_path))).values()
        await procs.stop()
        return pids

    pids = run_trio(body)
    found = _files(tmp_path)
    for pid in pids:
        assert {f"atexit-{pid}", f"finalizer-{pid}", f"server-atexit-{pid}"} <= found
        assert f"server-finalizer-{pid}" not in found
