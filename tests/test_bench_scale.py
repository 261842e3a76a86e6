"""``python -m otpmesh.bench scale``: a smoke test of its code paths (one worker, a broadcast to
2, the fork server preloading nothing), not a measurement: no figure is checked for speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)

SMOKE = ("--sizes", "1", "2", "--broadcast", "2", "--imports", "msgpack", "trio")


def test_the_scale_benchmark_reports_memory_imports_and_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "otpmesh.bench", "scale", *SMOKE],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "OTPMESH_PRELOAD": ""},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    memory = result["memory"]
    assert memory["workers"] == 4
    assert 0 < memory["worker_private_dirty_mb"] <= memory["worker_rss_mb"]
    assert memory["workers_pss_mb"] > 0 and memory["fork_server_pss_mb"] > 0
    assert [row["module"] for row in result["imports"]][:3] == [
        "(python itself)",
        "msgpack",
        "trio",
    ]
    start = result["start"]
    assert set(start) == {
        "procs_1_s",
        "procs_2_s",
        "broadcast_2_ms_p50",
        "broadcast_2_bare_trio_ms_p50",
        "broadcast_2_vs_bare",
    }
    assert start["broadcast_2_bare_trio_ms_p50"] > 0
    assert start["procs_2_s"]["to_first_broadcast"] >= start["procs_2_s"]["started"] > 0
    assert len(result["machine"]["load_1min_before_after"]) == 2
