"""``otpmesh bench rdma`` end to end, small: every path it reports ran, over the channel it
names, beside the baselines of the same run (the speeds themselves are for the benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys

from otpmesh._wire._tensors import CHANNEL_THRESHOLD
from otpmesh.bench.rdma import WHAT


def test_one_small_run_reports_each_path_beside_copy_and_clone() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "otpmesh.bench", "rdma", "--sizes", "1", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [row["what"] for row in rows] == [*WHAT, "argument inline"]
    for row in rows:
        assert row["ok"] and row["backend"] == "shm", row
        assert row["seconds"] > 0 and row["copy_gb_per_s"] > 0 and row["clone_gb_per_s"] > 0
    inline = rows[-1]
    assert inline["bytes"] == CHANNEL_THRESHOLD - 4  # in the message, just below the channel
    measured = inline["bytes"] / inline["seconds"] / 1e9  # its speed is of its own bytes
    assert abs(inline["gb_per_s"] - measured) <= 0.05 * measured + 0.01
    assert all("first_gb_per_s" in row for row in rows if row["what"] != "read_into")


def test_a_controller_run_reports_each_path_over_shm() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "otpmesh.bench", "rdma", "--controller", "--sizes", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [row["what"] for row in rows] == ["argument", "result", "read_into", "write_from"]
    for row in rows:
        assert row["ok"] and row["backend"] == "shm" and row["seconds"] > 0, row
