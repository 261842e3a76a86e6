"""Under pytest-xdist, a test marked ``whole_machine`` runs while no other test does (the
readers-writer lock in tests/conftest.py). A real xdist run of two workers, in a temporary
directory with this suite's conftest: each test waits until it sees the other one either
running or blocked on the lock (a waiter the kernel lists in /proc/locks), so without the lock
the two would overlap, every time, and with it neither waits on a clock."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

_WAIT = """
import os, time

def other_blocked(config):
    # A request blocked on one of this run's lock files: '... -> POSIX ADVISORY ...'.
    locks = config.workerinput["otpmesh_locks"]
    inodes = {str(os.stat(os.path.join(locks, n)).st_ino) for n in os.listdir(locks)}
    with open("/proc/locks") as table:
        return any(
            "->" in line and line.split()[-3].rsplit(":", 1)[1] in inodes for line in table
        )

def wait_for(config, path):
    # Both tests land on one worker only if xdist puts them there: then nothing overlaps
    # anyway, and the 30 s are the only wait.
    deadline = time.monotonic() + 30
    while not (os.path.exists(path) or other_blocked(config)) and time.monotonic() < deadline:
        time.sleep(0.02)
"""

_MARKED = (
    _WAIT
    + """
import pytest

@pytest.mark.whole_machine
def test_alone(request):
    wait_for(request.config, "started")
    running = os.path.exists("running")
    open("marked-done", "w").close()
    assert not running, "an unmarked test was running beside a whole_machine one"
"""
)

_UNMARKED = (
    _WAIT
    + """
def test_beside(request):
    open("running", "w").close()  # before "started": the marked test reads them in that order
    open("started", "w").close()
    wait_for(request.config, "marked-done")
    os.unlink("running")
"""
)


@pytest.mark.timeout(120)
def test_a_whole_machine_test_never_runs_beside_another_under_xdist(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makeini(
        "[pytest]\nmarkers =\n    whole_machine: runs alone\n    slow: long\n"
        "    erlang: erlang\n    ibverbs: ibverbs\n"
    )
    pytester.makepyfile(test_marked=_MARKED, test_unmarked=_UNMARKED)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
