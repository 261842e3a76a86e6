"""Programs without an event loop (``.get()``) or with asyncio's own (``asyncio.run``): otpmesh
runs them in its background run, and at exit no worker is left running."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import alive

ROOT = Path(__file__).parent.parent

ACTOR = """\
import asyncio, os, sys
import trio
import otpmesh

class Counter(otpmesh.Actor):
    def __init__(self, start, note=None):
        self.count = start
        self.note = note

    async def on_stop(self, reason):
        if self.note is not None:
            with open(self.note, "a") as f:
                f.write(f"{otpmesh.context().path} stopped\\n")

    @otpmesh.endpoint
    async def value(self):
        self.count += 1
        return self.count, os.getpid()

    @otpmesh.endpoint
    async def nap(self, seconds):
        await trio.sleep(seconds)
"""

SYNC = (
    ACTOR
    + """
procs = otpmesh.proc_mesh(procs=2).get()
mesh = procs.spawn("c", Counter, 0, note=sys.argv[1]).get()
print("values", [v for v, _ in mesh.value.call().get()])
print("one", mesh[1].value.call_one().get()[0])
try:
    mesh[0].nap(60).get(timeout=0.5)
except otpmesh.CallTimeoutError as exc:
    print("timeout", exc)
print("pids", *[p for _, p in mesh.value.call().get()])
"""  # exits without stopping anything: the background run stops it in order
)

ASYNCIO = (
    ACTOR
    + """
async def main():
    procs = await otpmesh.proc_mesh(procs=2)
    mesh = await procs.spawn("c", Counter, 10)
    task = asyncio.create_task(mesh[0].value.call_one())  # a Future is a coroutine to asyncio
    print("values", [v for v, _ in await mesh.value.call()], (await task)[0] > 10)
    napping = asyncio.create_task(mesh[1].nap(60))
    await asyncio.sleep(0.5)
    napping.cancel()  # cancels the call in trio, and so the endpoint: the next call answers
    print("after", (await asyncio.wait_for(mesh[1].value.call_one(), 30))[0])
    print("pids", *[p for _, p in await mesh.value.call()])
    await procs.stop()

asyncio.run(main())
"""
)


def _run(program: str, *args: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10  # a worker's exit after its controller's is not instant
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


@pytest.mark.timeout(120)
def test_a_sync_script_uses_get_and_at_exit_stops_its_actors_and_leaves_no_worker(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "stopped.txt"
    out = _run(SYNC, str(notes))
    assert out["values"] == "[1, 1]" and out["one"] == "2"
    assert out["timeout"] == "call to 'nap' on c/0 timed out after 0.5 s"
    assert _gone([int(p) for p in out["pids"].split()])
    assert sorted(notes.read_text().splitlines()) == ["c/0 stopped", "c/1 stopped"]


@pytest.mark.timeout(120)
def test_an_asyncio_program_awaits_futures_in_the_background_run() -> None:
    out = _run(ASYNCIO)
    assert out["values"] in ("[11, 11] True", "[12, 11] True")  # the task ran after or before
    assert out["after"] == "12"
    assert _gone([int(p) for p in out["pids"].split()])


@pytest.mark.timeout(120)
def test_the_sync_benchmark_reports_get_beside_await() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "otpmesh.bench", "sync", "--calls", "20", "--pipelined", "50"],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["get_vs_await"] > 0 and result["pipelined_await_calls_per_s"]["rate"] > 0
