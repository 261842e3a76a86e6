"""Soak: a supervised mesh under a ChaosMonkey for minutes, checking that nothing leaks.

Opt-in (marked slow): ``bash .ci/dev test -m slow tests/test_soak.py -s``. The length comes from
OTPMESH_SOAK_SECONDS (default 300) and the fault rate from OTPMESH_SOAK_RATE (default 4/s, so
about 1,200 faults in 5 minutes). It prints one JSON report: faults injected, restarts, calls made
and answered, controller and worker RSS and open file descriptors at start and end.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, LogKind, Mesh, Supervisor, chaos
from tests.actors import Member
from tests.conftest import run_trio

SECONDS = float(os.environ.get("OTPMESH_SOAK_SECONDS", "300"))
RATE = float(os.environ.get("OTPMESH_SOAK_RATE", "4"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(SECONDS + 300)]


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _children_of(parents: set[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) in parents and fields[0] != "Z":
            found.append(int(entry))
    return found


def _our_workers() -> list[int]:
    """Worker processes are the children of our fork server, itself a child of this process."""
    servers = set()
    for pid in _children_of({os.getpid()}):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"otpmesh._runtime._forkserver" in f.read():
                    servers.add(pid)
        except OSError:
            continue
    return _children_of(servers) if servers else []


def _snapshot() -> dict[str, int]:
    workers = _our_workers()
    return {
        "controller_rss_kib": _rss_kib(os.getpid()),
        "controller_fds": _fds(os.getpid()),
        "workers": len(workers),
        "worker_rss_kib": sum(_rss_kib(p) for p in workers),
        "worker_fds": sum(_fds(p) for p in workers),
    }


def test_soak_a_mesh_under_a_chaos_monkey() -> None:
    tree = Supervisor(
        "soak",
        intensity=10_000,
        period=1.0,
        children=[
            Mesh(
                "m", Member, shape={"procs": 4}, strategy=ONE_FOR_ONE, intensity=10_000, period=1.0
            )
        ],
    )
    report: dict[str, object] = {"seconds": SECONDS, "rate": RATE}

    async def body() -> None:
        calls = {"made": 0, "answered": 0, "errors": 0}
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("soak/m").with_timeout(10.0)
            await mesh.ping()
            await trio.sleep(1.0)
            report["start"] = _snapshot()
            monkey = chaos.ChaosMonkey(
                app,
                seed=2026,
                rate=RATE,
                targets=["soak/m/*"],
                faults={"kill": 2, "crash": 2, "stop": 1},
            )

            async def caller(rank: int, until: float) -> None:
                while trio.current_time() < until:
                    calls["made"] += 1
                    try:
                        await otpmesh.retry(mesh[rank].count, attempts=10)
                        calls["answered"] += 1
                    except otpmesh.OtpmeshError:
                        calls["errors"] += 1

            started = time.monotonic()
            until = trio.current_time() + SECONDS
            async with monkey.running(), trio.open_nursery() as nursery:
                for rank in range(4):
                    nursery.start_soon(caller, rank, until)
            report["wall_s"] = round(time.monotonic() - started, 1)
            await app.settled()
            await mesh.ping()
            await trio.sleep(1.0)
            report["end"] = _snapshot()
            report["faults"] = len(monkey.injected)
            report["faults_that_hit"] = sum(f.hit for f in monkey.injected)
            report["restarts"] = sum(
                1
                for e in app.events
                if e.kind == LogKind.CHILD_STARTED and (e.incarnation or 0) > 1
            )
            report["calls"] = calls
        await trio.sleep(2.0)
        report["workers_after_stop"] = len(_our_workers())

    run_trio(body, timeout=SECONDS + 240)
    print("\nSOAK " + json.dumps(report))
    start, end = report["start"], report["end"]
    assert isinstance(start, dict) and isinstance(end, dict)
    assert report["faults"] >= RATE * SECONDS * 0.8
    assert report["workers_after_stop"] == 0  # no orphans
    assert end["controller_fds"] <= start["controller_fds"]
    assert end["worker_fds"] <= start["worker_fds"]
    assert end["controller_rss_kib"] < start["controller_rss_kib"] * 1.10
    assert end["worker_rss_kib"] < start["worker_rss_kib"] * 1.10
    calls = report["calls"]
    assert isinstance(calls, dict) and calls["answered"] + calls["errors"] == calls["made"]
