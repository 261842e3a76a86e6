"""``python -m otpmesh.bench instructions``: each side of a round trip counted by callgrind, real
processes over a real socket. Slow (every process runs under valgrind, about a minute of CPU):
it runs with ``-m slow``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("valgrind") is None or shutil.which("cc") is None,
        reason="needs valgrind and a C compiler",
    ),
]


@pytest.mark.timeout(900)
def test_quick_counts_instructions_per_round_trip_on_each_side_of_both_pairs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "otpmesh.bench", "instructions", "--quick"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    for kind in ("bare", "otpmesh"):
        # A round trip is thousands of instructions on each side, not start-up's billions.
        assert 10_000 < result[kind]["caller_per_call"] < 10_000_000, result
        assert 10_000 < result[kind]["server_per_call"] < 10_000_000, result
    assert result["caller_vs_bare"] > 0 and result["server_vs_bare"] > 0
