"""Heartbeat silence: a stopped worker is hung, a starved or busy one is not (yet)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from otpmesh._runtime._liveness import (
    HARD_FACTOR,
    describe_status,
    proc_state,
    verdict,
    zombie_status,
)


def test_a_stopped_process_is_hung_at_the_timeout() -> None:
    assert verdict("T", 2.0, 2.0) == "hung (stopped: no heartbeat for 2 s)"
    assert verdict("t", 2.5, 2.0) == "hung (stopped: no heartbeat for 2 s)"


def test_a_running_or_sleeping_process_is_given_time_then_called_wedged() -> None:
    for state in ("R", "S", "D"):
        assert verdict(state, 2.0, 2.0) is None  # starved, or busy in C: not yet
        assert verdict(state, HARD_FACTOR * 2.0 - 0.1, 2.0) is None
        assert verdict(state, HARD_FACTOR * 2.0, 2.0) == (
            f"hung (running, but no heartbeat for {HARD_FACTOR * 2.0:g} s)"
        )


def test_a_process_already_gone_is_left_to_its_exit_report() -> None:
    for state in (None, "Z", "X"):
        assert verdict(state, 100.0, 2.0) is None


def test_the_state_is_read_from_the_kernel() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while proc_state(child.pid) != "S" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc_state(child.pid) == "S"
        os.kill(child.pid, signal.SIGSTOP)
        while proc_state(child.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc_state(child.pid) == "T"
    finally:
        child.kill()
        child.wait()
    assert proc_state(child.pid) is None
    assert proc_state(os.getpid()) == "R"


def test_a_worker_silent_but_not_stopped_is_not_killed_at_the_heartbeat_timeout() -> None:
    """Twice the heartbeat timeout with the GIL held in C (no beat can be sent): the worker is
    not declared hung; a SIGSTOPped one is (test_chaos.py)."""
    import trio

    import otpmesh
    from otpmesh._runtime._controller_runtime import HEARTBEAT_TIMEOUT
    from tests.actors import GilHolder
    from tests.conftest import run_trio

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            holder = (await procs.spawn("g", GilHolder))[0]
            pid = procs.pids[0]
            assert await holder.hold(2 * HEARTBEAT_TIMEOUT) == pid
            await trio.sleep(0.5)  # beats resume; the process is the same one, still up
            assert procs.pids == [pid] and await holder.hold(0) == pid

    run_trio(body, timeout=60)


def test_an_unreaped_child_says_its_own_exit_status_and_only_to_its_parent() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    try:
        deadline = time.monotonic() + 10
        while proc_state(pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.001)
        assert zombie_status(pid, os.getppid()) is None  # not a child of that process
        status = zombie_status(pid, os.getpid())
    finally:
        _, reaped = os.waitpid(pid, 0)
    assert status == reaped
    assert describe_status(reaped) == "exited with code 3"
    assert zombie_status(pid, os.getpid()) is None  # reaped: the pid may be anyone's now
