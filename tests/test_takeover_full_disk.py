"""Another user fills the file system under a takeover's state directory (a small tmpfs, a
dummy file) while the app runs and restarts actors, with real processes: the app goes on
restarting, says once that takeover is unavailable, and once the dummy is gone the journal is
written whole again and a standby takes the tree over from it, every restart counted. Before,
the first append that met the full disk raised ENOSPC in the supervisor's loop, and the
controller died ("otpmesh runtime failed", every worker gone)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.test_journal_faults import fill, small_fs
from tests.test_takeover import JOB_ENTRY, Program, _children, _wait_gone

JOB = """
import contextlib
import os
import pathlib

import trio

import otpmesh
from otpmesh import Supervisor, Worker


class Flaky(otpmesh.Actor):
    @otpmesh.endpoint
    async def crash(self) -> None:
        raise RuntimeError("boom")


TREE = Supervisor("job", children=[
    Supervisor("busy", intensity=1_000_000, period=0.05, children=[Worker("churn", Flaky)]),
])


def churn(app: otpmesh.App) -> int:
    return app.which_children("job/busy")[0].incarnation


async def main(state: str, standby: bool) -> None:
    control = pathlib.Path(state).parent.parent  # beside the small file system, not on it
    grace = float(os.environ.get("JOB_GRACE", "60"))
    takeover = otpmesh.Takeover(dir=state, grace=grace, standby=standby, journal_bytes=4096)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        if standby:
            print("took over", churn(app), flush=True)
            return
        print("ready", flush=True)
        while not (control / "filled").exists():
            await trio.sleep(0.05)
        crashes = 0
        while not (control / "freed").exists() and crashes < 5000:
            with contextlib.suppress(otpmesh.ActorError):
                await app.actor("job/busy/churn").crash()
            await app.settled()
            crashes += 1
            if crashes % 20 == 0:
                print("crashes", crashes, flush=True)
        print("stopped crashing at", churn(app), flush=True)
        await trio.sleep_forever()
"""

UNAVAILABLE = "takeover is unavailable"


def _line_with(program: Program, text: str) -> str:
    """The first line of `program`'s output holding `text`, read already or still to come."""
    for line in program.lines:
        if text in line:
            return line
    while text not in (line := program.wait_for("")):
        pass
    return line


@pytest.mark.timeout(120)
def test_a_full_disk_leaves_the_app_running_and_the_journal_whole_once_it_has_room(
    tmp_path: Path,
) -> None:
    with small_fs(tmp_path / "fs", "1m") as fs:
        job, state = tmp_path / "job.py", fs / "state"
        job.write_text(JOB + JOB_ENTRY)
        active = Program(state, program=job)
        active.wait_for("ready")
        dummy = fill(fs)
        (tmp_path / "filled").touch()
        _line_with(active, UNAVAILABLE)
        fill(fs)  # what cutting the journal to its gap freed: the filler takes it too
        for _ in range(2):  # it goes on restarting with the file system full
            active.wait_for("crashes")
        dummy.unlink()
        (tmp_path / "freed").touch()
        last = _line_with(active, "stopped crashing at").split()[-1]
        _line_with(active, "is whole again: takeover is available")
        lines = active.lines
        assert sum(UNAVAILABLE in line for line in lines) == 1, lines
        assert not any("otpmesh runtime failed" in line for line in lines), lines
        active.proc.send_signal(signal.SIGKILL)
        active.proc.wait(10)

        standby = Program(state, "--standby", program=job)
        assert standby.wait_for("took over").split()[-1] == last  # every restart journalled
        standby.finish()


@pytest.mark.timeout(120)
def test_a_standby_that_takes_over_while_the_journal_is_unavailable_starts_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not from a journal that misses the restarts it could not write: from nothing, as after a
    stop; the old workers exit at the end of their grace period."""
    monkeypatch.setenv("JOB_GRACE", "3")
    with small_fs(tmp_path / "fs", "1m") as fs:
        job, state = tmp_path / "job.py", fs / "state"
        job.write_text(JOB + JOB_ENTRY)
        active = Program(state, program=job)
        active.wait_for("ready")
        dummy = fill(fs)
        (tmp_path / "filled").touch()
        _line_with(active, UNAVAILABLE)
        active.wait_for("crashes")
        fork_server = _children(active.proc.pid)
        workers = [pid for parent in fork_server for pid in _children(parent)]
        active.proc.send_signal(signal.SIGKILL)
        active.proc.wait(10)
        dummy.unlink()  # room for the standby's epoch (a full disk fails a takeover there)

        standby = Program(state, "--standby", program=job)
        assert standby.wait_for("took over").split()[-1] == "1"  # a fresh tree
        standby.finish()
        assert workers and _wait_gone([*fork_server, *workers], 3 + 15) == []
