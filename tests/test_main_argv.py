"""A worker imports the controller's main file with the controller's ``sys.argv``, as
multiprocessing's spawn, Ray and Monarch give their workers the driver's: module-level code that
reads the arguments computes the same values in every process."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """\
import os, sys
import otpmesh

MARK = sys.argv[1]  # module level: run again by each worker that imports this file

class Saver(otpmesh.Actor):
    @otpmesh.endpoint
    async def mark(self):
        return MARK, sys.argv, os.getpid()

async def main():
    procs = await otpmesh.proc_mesh(procs=2)
    savers = await procs.spawn("saver", Saver)
    print(repr((MARK, sys.argv, os.getpid(), (await savers.mark.call()).values())))
    await procs.stop()

if __name__ == "__main__":
    otpmesh.run(main)
"""


@pytest.mark.timeout(60)
def test_a_script_s_module_level_reads_the_controller_s_arguments_in_its_workers(
    tmp_path: Path,
) -> None:
    script = tmp_path / "saver.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "OTPMESH_PRELOAD"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, str(script), "run-7", "--lr", "0.1"],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    mark, argv, pid, answers = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert (mark, argv) == ("run-7", [str(script), "run-7", "--lr", "0.1"])
    assert [(m, a) for m, a, _ in answers] == [(mark, argv)] * 2
    assert all(worker != pid for _, _, worker in answers)  # in the workers, not here
