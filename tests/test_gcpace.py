"""The garbage collector's pace (otpmesh/_runtime/_gcpace.py): collected less often in workers
and under otpmesh.run, Python's default elsewhere and with OTPMESH_GC_THRESHOLD=0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = """
import gc, sys
sys.path.insert(0, {root!r})
import otpmesh
from tests.actors import GcReporter

async def main() -> None:
    procs = await otpmesh.proc_mesh(procs=1)
    worker = await procs.spawn("gc", GcReporter)
    print(gc.get_threshold()[0], (await worker[0].threshold()))
    await procs.stop()

if __name__ == "__main__":
    print(gc.get_threshold()[0])
    otpmesh.run(main)
"""


def _thresholds(tmp_path: Path, env: dict[str, str]) -> list[str]:
    script = tmp_path / "gc_pace.py"
    script.write_text(PROGRAM.format(root=str(ROOT)))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_workers_and_otpmesh_run_collect_less_often(tmp_path: Path) -> None:
    before, controller, worker = _thresholds(tmp_path, {})
    assert before == "700"  # Python's default until otpmesh.run
    assert controller == worker == "20000"


def test_a_zero_threshold_keeps_pythons_default(tmp_path: Path) -> None:
    assert _thresholds(tmp_path, {"OTPMESH_GC_THRESHOLD": "0"}) == ["700", "700", "700"]
