"""Heartbeat silence: a stopped worker is hung, a starved or busy one is not (yet)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from otpmesh._runtime._liveness import (
    HARD_FACTOR,
    START_SILENCE,
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


def test_a_process_not_yet_started_has_the_starts_deadline_unless_it_is_stopped() -> None:
    for state in ("R", "S", "D"):
        assert verdict(state, HARD_FACTOR * 2.0, 2.0, started=False) is None
        assert verdict(state, START_SILENCE - 0.1, 2.0, started=False) is None
        assert verdict(state, START_SILENCE, 2.0, started=False) == (
            f"hung (starting, but no heartbeat for {START_SILENCE:g} s)"
        )
    # A timeout so long that HARD_FACTOR of it exceeds the start's deadline: the longer wins.
    assert verdict("R", START_SILENCE, 30.0, started=False) is None
    assert verdict("T", 2.0, 2.0, started=False) == "hung (stopped: no heartbeat for 2 s)"


def test_silence_while_starting_is_judged_at_the_starts_deadline_then_at_the_heartbeats() -> None:
    """The heartbeat watcher, under MockClock, on a real pipe nobody writes to and a live
    process (this one, running): not started, it is called hung at START_SILENCE, not at
    HARD_FACTOR timeouts; once started, silence is judged at HARD_FACTOR timeouts again, from
    the start's answer."""
    import trio.testing

    from otpmesh._runtime._workerpipes import BeatReader, watch_heartbeat

    async def silent_for(started_at: float | None) -> tuple[float, str]:
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        verdicts: list[tuple[float, str]] = []
        t0 = trio.current_time()
        try:
            await watch_heartbeat(
                BeatReader(read_end, lambda report: None),
                2.0,
                lambda: not verdicts,
                lambda why: verdicts.append((trio.current_time() - t0, why)),
                os.getpid,
                lambda: started_at is not None and trio.current_time() - t0 >= started_at,
            )
        finally:
            os.close(write_end)
        [found] = verdicts
        return found

    async def main() -> None:
        at, why = await silent_for(None)
        assert START_SILENCE <= at < START_SILENCE + 1.0, at
        assert why == f"hung (starting, but no heartbeat for {START_SILENCE:g} s)"
        # It answered its first spawn 30 s in, and then stayed silent: the answer says it was
        # alive then, so it is hung HARD_FACTOR timeouts later, not at once. Before, it was
        # called hung as soon as it answered (silent for 30 s by then), unless a beat came
        # first: a race a loaded machine lost (test_a_worker_whose_constructor_starves...).
        at, why = await silent_for(30.0)
        hung_at = 30.0 + HARD_FACTOR * 2.0
        assert hung_at <= at < hung_at + 1.0, at
        assert why == f"hung (running, but no heartbeat for {HARD_FACTOR * 2.0:g} s)"

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_beats_keep_a_worker_alive_and_their_end_starts_the_silence() -> None:
    """The watcher under MockClock: a beat every second for 30 s, then none; the process (this
    one, running, started) is called hung HARD_FACTOR timeouts after its last beat, not before."""
    import trio.testing

    from otpmesh._runtime._workerpipes import BeatReader, watch_heartbeat

    async def main() -> None:
        read_end, write_end = os.pipe()
        verdicts: list[float] = []
        t0 = trio.current_time()

        async def beat() -> None:
            for _ in range(30):
                await trio.sleep(1.0)
                os.write(write_end, b".")

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(beat)
                await watch_heartbeat(
                    BeatReader(read_end, lambda report: None),
                    2.0,
                    lambda: not verdicts,
                    lambda why: verdicts.append(trio.current_time() - t0),
                    os.getpid,
                )
        finally:
            os.close(write_end)
        [at] = verdicts
        assert 30.0 + HARD_FACTOR * 2.0 <= at < 31.0 + HARD_FACTOR * 2.0, at

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


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
    from otpmesh._runtime._proc import HEARTBEAT_TIMEOUT
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


def test_a_worker_whose_constructor_starves_its_heartbeat_is_not_killed_as_hung() -> None:
    """A constructor that holds the GIL (no beat can be sent) for longer than HARD_FACTOR
    heartbeat timeouts, as a worker importing and compiling beside a thousand others on a
    loaded machine does: it is starting, not hung, and its actor starts in that process."""
    import trio

    import otpmesh
    from otpmesh import LogKind, Supervisor, Worker
    from tests.actors import SlowGilStart
    from tests.conftest import run_trio

    timeout = 0.3
    tree = Supervisor("s", children=[Worker("w", SlowGilStart, args=(HARD_FACTOR * timeout + 1,))])

    async def body() -> None:
        async with otpmesh.start(tree, heartbeat_timeout=timeout) as app:
            pid = await app.actor("s/w").pid()
            await trio.sleep(2 * timeout)  # beating again: judged by its heartbeat from now on
            assert await app.actor("s/w").pid() == pid
            assert app.events.of_kind(LogKind.CHILD_EXITED) == []

    run_trio(body, timeout=90)


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
