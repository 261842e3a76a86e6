"""What an idle worker costs (docs/architecture.md, "What a worker costs"): the fork server's
objects stay shared with the workers it forks, even after a full collection in a worker."""

from __future__ import annotations

import pytest

import otpmesh
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
