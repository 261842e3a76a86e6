"""Under pytest-xdist, a test marked ``whole_machine`` runs while no other test does (the
readers-writer lock in tests/conftest.py). A real xdist run of two workers, in a temporary
directory with this suite's conftest: the unmarked test stays running until the marked one is
over, or for 10 s, so without the lock the two would overlap, every time."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

_MARKED = """
import os, time
import pytest

@pytest.mark.whole_machine
def test_alone():
    # Let the unmarked test start first where nothing holds it back.
    deadline = time.monotonic() + 10
    while not os.path.exists("started") and time.monotonic() < deadline:
        time.sleep(0.05)
    running = os.path.exists("running")
    open("marked-done", "w").close()
    assert not running, "an unmarked test was running beside a whole_machine one"
"""

_UNMARKED = """
import os, time

def test_beside():
    open("started", "w").close()
    open("running", "w").close()
    deadline = time.monotonic() + 10
    while not os.path.exists("marked-done") and time.monotonic() < deadline:
        time.sleep(0.05)
    os.unlink("running")
"""


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
