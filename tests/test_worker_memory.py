"""What an idle worker costs (docs/architecture.md, "What a worker costs"): the fork server's
objects stay shared with the workers it forks, even after a full collection in a worker; and
its heartbeats wake the controller no more than four times per heartbeat timeout."""

from __future__ import annotations

import pytest

import otpmesh
from otpmesh._runtime._proc import BEATS_PER_TIMEOUT, HEARTBEAT_INTERVAL, beat_interval
from tests.actors import MemoryReporter
from tests.conftest import run_trio

pytestmark = pytest.mark.timeout(120)

#: What a full collection may still write in an idle worker: its own objects, a few pages.
#: Without the fork server's gc.freeze() it wrote 8 MB here (numpy preloaded), 39 MB with
#: torch preloaded.
MAX_WRITTEN_KB = 3 * 1024


def test_a_full_collection_in_a_worker_leaves_the_fork_servers_objects_shared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # numpy: a preloaded library with many objects, cheap enough to import in a test.
    monkeypatch.setenv("OTPMESH_PRELOAD", "numpy")

    async def body() -> tuple[int, int]:
        procs = await otpmesh.proc_mesh(procs=1)
        try:
            worker = (await procs.spawn("memory", MemoryReporter))[0]
            before = await worker.private_dirty_kb()
            await worker.collect()
            return before, await worker.private_dirty_kb()
        finally:
            await procs.stop()

    before, after = run_trio(body)
    print(f"private dirty {before} kB, after a full collection {after} kB")
    assert after - before < MAX_WRITTEN_KB, (before, after)


def test_workers_beat_four_times_per_heartbeat_timeout_never_more_often_than_the_interval() -> None:
    # Every beat wakes the controller: a thousand idle workers at one beat per 0.2 s cost it a
    # third of a core. 4 per timeout is enough, and a short timeout keeps the 0.2 s floor.
    assert beat_interval(2.0) == 2.0 / BEATS_PER_TIMEOUT == 0.5
    assert beat_interval(60.0) == 15.0
    assert beat_interval(0.3) == HEARTBEAT_INTERVAL == 0.2
