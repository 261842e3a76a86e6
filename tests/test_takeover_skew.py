"""Version skew is never silent: a standby running other code, or another tree, than the
controller it would replace refuses and says what differs; ``Takeover(upgrade=True)`` takes
over anyway (real processes, a real SIGKILL). Before, the changed job ran: adopted actors kept
the old code, new incarnations ran the new one, and the results mixed both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

JOB = """
import os, trio, otpmesh
from otpmesh import Mesh, Supervisor

CONST = {const}


class Shard(otpmesh.Actor):
    @otpmesh.endpoint
    async def add(self) -> int:
        return CONST


TREE = Supervisor("job", children=[Mesh("shards", Shard, shape={{"procs": {shards}}})])


async def main() -> None:
    takeover = otpmesh.Takeover(
        dir=os.environ["STATE"],
        grace=20.0,
        standby=os.environ.get("STANDBY") == "1",
        upgrade=os.environ.get("UPGRADE") == "1",
    )
    async with otpmesh.start(TREE, takeover=takeover) as app:
        values = list((await app.mesh("job/shards").add()).values())
        print("running", app.resumed is not None, values, flush=True)
        await trio.sleep(float(os.environ.get("HOLD", "60")))


if __name__ == "__main__":
    otpmesh.run(main)
"""


def _job(tmp_path: Path, name: str, const: int, shards: int) -> Path:
    path = tmp_path / name
    path.write_text(JOB.format(const=const, shards=shards))
    return path


def _takeover(
    tmp_path: Path, const: int, shards: int, upgrade: bool
) -> subprocess.CompletedProcess[str]:
    """An active controller (CONST=1, 2 shards) SIGKILLed, then a standby of the changed job."""
    env = dict(os.environ, STATE=str(tmp_path / "state"))
    active = subprocess.Popen(
        [sys.executable, str(_job(tmp_path, "job.py", 1, 2))],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert active.stdout is not None
        assert active.stdout.readline().startswith("running False [1, 1]")
    finally:
        active.send_signal(signal.SIGKILL)
        active.wait(10)
    standby_env = dict(env, STANDBY="1", HOLD="0", UPGRADE="1" if upgrade else "0")
    changed = _job(tmp_path, "job2.py", const, shards)
    return subprocess.run(
        [sys.executable, str(changed)], env=standby_env, capture_output=True, text=True, timeout=90
    )


@pytest.mark.timeout(120)
def test_a_standby_with_a_changed_constant_refuses_and_names_the_class(tmp_path: Path) -> None:
    done = _takeover(tmp_path, const=100, shards=2, upgrade=False)
    assert done.returncode != 0 and "running" not in done.stdout
    assert "Shard: its module's code changed" in done.stderr, done.stderr
    assert "Takeover(..., upgrade=True)" in done.stderr


@pytest.mark.timeout(120)
def test_a_standby_with_a_changed_tree_refuses_and_names_what_changed(tmp_path: Path) -> None:
    done = _takeover(tmp_path, const=1, shards=3, upgrade=False)
    assert done.returncode != 0 and "running" not in done.stdout
    assert "job/shards: its spec (shape, strategy" in done.stderr, done.stderr
    assert "job/shards/2 is new in this tree" in done.stderr


@pytest.mark.timeout(120)
def test_upgrade_true_takes_the_changed_job_over_and_says_so(tmp_path: Path) -> None:
    done = _takeover(tmp_path, const=100, shards=2, upgrade=True)
    assert done.returncode == 0, done.stderr
    assert "running True [1, 1]" in done.stdout  # adopted actors: still the old code
    assert "taking over a run of other code (upgrade=True)" in done.stderr
