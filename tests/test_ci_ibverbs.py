"""``bash .ci/dev ibverbs``: what each status of the soft-RoCE runner makes of the CI step.

Issue 42: a guest that hung in collection came back as "the guest never ran the command" (98),
the step printed "ibverbs tests NOT run" and exited 0, and CI went green. A hung or dead guest
(124) fails the step; so do 97 and 98 unless OTPMESH_IBVERBS_OPTIONAL=1; only a machine without
the runner at all skips (loudly). The runner is replaced by a script that exits with a chosen
status; ``.ci/dev`` and ``tests/rdma/run_softroce.sh`` are the real ones. ``.ci/dev`` is given a
venv of its own whose stamp is fresh, so it never installs anything here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import alive

ROOT = Path(__file__).resolve().parent.parent

FAKE_RUNNER = """#!/bin/bash
printf '%s\\n' "$@" > "$FAKE_OUT/args"
readlink /proc/self/fd/0 > "$FAKE_OUT/stdin"
echo $$ > "$FAKE_OUT/pid"
[ -z "${FAKE_SLEEP:-}" ] || sleep "$FAKE_SLEEP"
exit "$FAKE_STATUS"
"""


def _venv(tmp_path: Path) -> Path:
    """A venv .ci/dev takes as set up: a python, and an install stamp newer than pyproject."""
    venv = tmp_path / "venv"
    if not venv.exists():
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").symlink_to(sys.executable)
    stamp = venv / ".otpmesh-installed"
    stamp.touch()
    later = max(time.time(), (ROOT / "pyproject.toml").stat().st_mtime + 1)
    os.utime(stamp, (later, later))
    return venv


def _env(tmp_path: Path, status: int | None, **env: str) -> dict[str, str]:
    """The environment of ``bash .ci/dev ibverbs`` with a runner that exits `status` (None: no
    runner at all)."""
    runner = tmp_path / "run"
    if status is not None:
        runner.write_text(FAKE_RUNNER)
        runner.chmod(0o755)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SOFTROCE", "OTPMESH_"))}
    return {
        **keep,
        "OTPMESH_VENV": str(_venv(tmp_path)),
        "SOFTROCE": str(runner),
        "FAKE_OUT": str(tmp_path),
        "FAKE_STATUS": str(status),
        **env,
    }


def _ibverbs_step(
    tmp_path: Path, status: int | None, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``bash .ci/dev ibverbs`` with a runner that exits `status` (None: no runner)."""
    return subprocess.run(
        ["bash", ".ci/dev", "ibverbs"],
        cwd=ROOT,
        env=_env(tmp_path, status, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_a_passing_guest_passes_and_its_runner_gets_a_timeout_and_no_terminal(
    tmp_path: Path,
) -> None:
    done = _ibverbs_step(tmp_path, 0)
    assert done.returncode == 0, done.stderr
    args = (tmp_path / "args").read_text().splitlines()
    # The guest's limit is well under CI's 90 minutes, and the step's default.
    assert args[:3] == ["--timeout", "2700", "--"], args
    assert (tmp_path / "stdin").read_text().strip() == "/dev/null"
    assert "installing" not in done.stderr


def test_failing_tests_fail_the_step(tmp_path: Path) -> None:
    done = _ibverbs_step(tmp_path, 1)
    assert done.returncode == 1, done.stderr


def test_a_hung_or_dead_guest_fails_the_step(tmp_path: Path) -> None:
    done = _ibverbs_step(tmp_path, 124)
    assert done.returncode == 124, done.stderr
    assert "FAILED" in done.stderr and "did not finish" in done.stderr, done.stderr
    assert "NOT run" not in done.stderr
    # Optional or not: tests that started and never ended are a failure.
    done = _ibverbs_step(tmp_path, 124, OTPMESH_IBVERBS_OPTIONAL="1")
    assert done.returncode == 124, done.stderr


@pytest.mark.parametrize("status", [97, 98])
def test_a_guest_that_could_not_run_fails_unless_the_step_is_optional(
    tmp_path: Path, status: int
) -> None:
    done = _ibverbs_step(tmp_path, status)
    assert done.returncode == status, done.stderr
    assert "FAILED" in done.stderr and "OTPMESH_IBVERBS_OPTIONAL=1" in done.stderr
    done = _ibverbs_step(tmp_path, status, OTPMESH_IBVERBS_OPTIONAL="1")
    assert done.returncode == 0, done.stderr
    assert "ibverbs tests NOT run" in done.stderr


def test_no_runner_at_all_is_a_loud_skip(tmp_path: Path) -> None:
    done = _ibverbs_step(tmp_path, None)
    assert done.returncode == 0, done.stderr
    assert "no soft-RoCE runner" in done.stderr and "NOT run" in done.stderr


def test_a_runner_that_never_returns_is_ended_by_the_steps_own_limit(tmp_path: Path) -> None:
    start = time.monotonic()
    done = _ibverbs_step(
        tmp_path, 0, timeout=30, FAKE_SLEEP="600", OTPMESH_IBVERBS_STEP_TIMEOUT="2"
    )
    assert done.returncode == 124, done.stderr
    assert "did not finish" in done.stderr
    assert time.monotonic() - start < 20


def test_ctrl_c_ends_the_step_and_its_runner(tmp_path: Path) -> None:
    """The step's timeout(1) runs in a process group of its own, which a terminal's Ctrl-C
    does not reach: .ci/dev passes the signal on instead of waiting out the limit."""
    step = subprocess.Popen(
        ["bash", ".ci/dev", "ibverbs"],
        cwd=ROOT,
        env=_env(tmp_path, 0, FAKE_SLEEP="600"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
            assert time.monotonic() < deadline, "the fake runner never started"
            time.sleep(0.05)
        runner = int((tmp_path / "pid").read_text())
        step.send_signal(signal.SIGINT)
        assert step.wait(timeout=20) != 0
        deadline = time.monotonic() + 10
        while alive(runner):
            assert time.monotonic() < deadline, "the runner outlived the interrupted step"
            time.sleep(0.05)
    finally:
        if step.poll() is None:
            step.kill()
            step.wait()
