"""Controller takeover with real processes and real SIGKILLs: a standby adopts a running tree
(every actor's state, value by value; no restart; nothing orphaned), workers without a standby
exit within their grace period, and a controller at a stale epoch is fenced off."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from otpmesh import Actor, FencedError, Supervisor, Takeover, TakeoverError, Worker
from otpmesh._controller._takeover import resume
from otpmesh._core._errors import ActorError
from otpmesh._core._supervisor import SupervisorCore
from otpmesh._core._supevents import ChildExited, ChildStarted, LogKind, StartChild
from otpmesh._node._node import Node
from otpmesh._runtime._appkey import unwrap
from otpmesh._runtime._forkclient import ForkServer
from otpmesh._runtime._lease import Lease
from otpmesh._runtime._statedir import open_state_dir
from otpmesh._wire._secret import load_secret

EXAMPLE = Path(__file__).parent.parent / "examples" / "takeover.py"
STEPS = 60


@pytest.fixture(autouse=True)
def _no_program_left() -> Iterator[None]:
    """A test that failed half-way leaves no controller running (a standby would wait for
    ever; the workers it adopted with it)."""
    yield
    programs, Program.started = Program.started, []
    for program in programs:
        program.end()


class Program:
    """One run of examples/takeover.py, its output read line by line as it comes."""

    #: Every program started by the test running now (``_no_program_left`` ends them).
    started: list[Program] = []

    def __init__(self, state: Path, *args: str, program: Path = EXAMPLE) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(program), "--dir", str(state), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        Program.started.append(self)

    def end(self) -> None:
        """Stop it if it still runs: SIGTERM (it stops its tree in order), then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, prefix: str, timeout: float = 90.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no line {prefix!r} in time; got:\n" + "\n".join(self.lines)
                ) from None
            if line is None:
                raise AssertionError(f"ended before {prefix!r}; got:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def said(self, prefix: str, timeout: float = 90.0) -> str:
        """The first line starting with `prefix`, read already or still to come (for lines in
        no set order: an actor's output is forwarded from its process's pipe, and the reply
        to the call that printed it can come first)."""
        for line in self.lines:
            if line.startswith(prefix):
                return line
        return self.wait_for(prefix, timeout)

    def finish(self, timeout: float = 120.0, status: int = 0) -> list[str]:
        assert self.proc.wait(timeout) == status, "\n".join(self.lines)
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return self.lines


def _journal(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "journal").read_text().splitlines()]


def _worker_pids(state: Path) -> dict[int, int]:
    """Rank -> pid of the workers the journal's first run started."""
    return {r["rank"]: r["pid"] for r in _journal(state) if "proc" in r and "actor" not in r}


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _shards(lines: list[str]) -> dict[int, tuple[int, int, int]]:
    """Rank -> (step, total, pid) from the driver's last lines."""
    found = {}
    for line in lines:
        if line.startswith("shard "):
            words = line.replace(":", "").split()
            found[int(words[1])] = (int(words[3]), int(words[5]), int(words[7]))
    return found


def _expected_total(rank: int) -> int:
    return (rank + 1) * STEPS * (STEPS + 1) // 2


def _sigkill_active(state: Path) -> tuple[dict[int, int], int]:
    """Start the active controller, let its driver run ten steps, SIGKILL it; its workers'
    pids by rank, and its fork server's pid."""
    active = Program(state, "--steps", str(STEPS), "--pause", "0.05", "--grace", "60")
    active.wait_for("step 10")
    workers = _worker_pids(state)
    fork_server = next(p for p in _children(active.proc.pid) if p not in workers.values())
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait(10)
    assert not _alive(active.proc.pid)
    return workers, fork_server


@pytest.mark.timeout(240)
def test_a_standby_takes_over_a_sigkilled_controller_and_every_actor_keeps_its_state(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    active = Program(state, "--steps", str(STEPS), "--pause", "0.05", "--grace", "60")
    active.wait_for("step 10")
    standby = Program(state, "--steps", str(STEPS), "--pause", "0.05", "--standby")
    workers = _worker_pids(state)
    fork_server = next(p for p in _children(active.proc.pid) if p not in workers.values())
    active.proc.send_signal(signal.SIGKILL)  # while its driver loop runs
    active.proc.wait(10)
    assert not _alive(active.proc.pid)

    started = standby.wait_for("driver (pid")
    step = int(started.split("starts at step ")[1].split(",")[0])
    assert step >= 10  # resumed where the actors were, not from 0
    assert started.endswith("incarnations [1, 1, 1, 1]")  # nothing was restarted
    assert _stale_epoch_refused(state, workers[0])  # the dead controller's epoch is fenced
    shards = _shards(standby.finish())
    for rank in range(4):  # every step applied exactly once, in the same processes
        assert shards[rank] == (STEPS, _expected_total(rank), workers[rank])
    assert _wait_gone([*workers.values(), fork_server], 15) == []  # nothing orphaned


@pytest.mark.timeout(240)
def test_a_standby_restarts_only_the_actor_whose_process_died_in_the_gap(tmp_path: Path) -> None:
    state = tmp_path / "state"
    workers, fork_server = _sigkill_active(state)
    os.kill(workers[2], signal.SIGKILL)  # lost while no controller was attached
    standby = Program(state, "--steps", str(STEPS), "--pause", "0.01", "--standby")
    started = standby.wait_for("driver (pid")
    assert started.endswith("incarnations [1, 1, 2, 1]")
    assert "starts at step 0," in started  # the new shard 2 starts from its constructor
    shards = _shards(standby.finish())
    for rank in range(4):  # the idempotent steps caught shard 2 up; the others kept theirs
        assert shards[rank][:2] == (STEPS, _expected_total(rank))
        assert (shards[rank][2] == workers[rank]) == (rank != 2)
    assert _wait_gone([*workers.values(), fork_server], 15) == []


@pytest.mark.timeout(120)
def test_without_a_standby_every_worker_exits_within_the_grace_period(tmp_path: Path) -> None:
    state = tmp_path / "state"
    active = Program(state, "--steps", "100000", "--pause", "0.05", "--grace", "3")
    active.wait_for("step 3")
    workers = list(_worker_pids(state).values())
    fork_server = next(p for p in _children(active.proc.pid) if p not in workers)
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait(10)
    assert all(_alive(p) for p in workers)  # waiting for a standby, state and all
    assert _wait_gone([*workers, fork_server], 3 + 15) == []


def _stale_epoch_refused(state: Path, pid: int) -> bool:
    """Whether worker `pid` refuses an adoption at epoch 1 (the dead controller's), and the
    fork server an attach at it, both with FencedError, though the secret is right."""
    records = _journal(state)
    app = next(r for r in records if "app" in r and r["epoch"] == 1)
    addr = next(r["addr"] for r in records if r.get("pid") == pid)

    async def body() -> bool:
        node = Node("ctl", secret=unwrap(load_secret(), app))
        async with trio.open_nursery() as nursery:
            await nursery.start(node.serve)
            conn = await node.connect(addr)
            payload = {"epoch": 1, "addr": node.addr, "pid": os.getpid()}
            with pytest.raises(ActorError) as refused:
                await node.sys_call(conn, "adopt", payload, "p1")
            assert refused.value.type_name == "FencedError"
            fork_server = ForkServer(lambda msg: None, lambda: None)
            with pytest.raises(FencedError, match="epoch 1 is not above"):
                await fork_server.attach(str(state / "forkserver.sock"), node.secret, 1)
            nursery.cancel_scope.cancel()
        return True

    return trio.run(body)


def test_a_state_dir_others_can_read_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "open"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    with pytest.raises(TakeoverError, match="must be 0700: chmod 700"):
        open_state_dir(state)


def test_a_second_active_controller_is_refused_and_told_to_stand_by(tmp_path: Path) -> None:
    held = Lease(open_state_dir(tmp_path / "state"))
    assert held.try_acquire()

    async def body() -> None:
        with pytest.raises(TakeoverError, match=r"standby=True"):
            await resume(Takeover(dir=tmp_path / "state"), Supervisor("s", children=[]))

    trio.run(body)
    held.release()


@pytest.mark.parametrize("grace", [0, -1.0, float("inf"), True, "30"])
def test_takeover_grace_must_be_a_positive_number_of_seconds(grace: object) -> None:
    with pytest.raises((ValueError, TypeError), match="grace"):
        Takeover(dir="/tmp/x", grace=grace)  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_a_standby_whose_run_stopped_in_order_ends_without_running_it_again(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    Program(state, "--steps", "3", "--pause", "0").finish()
    standby = Program(state, "--steps", "3", "--pause", "0", "--standby")
    lines = standby.finish()  # status 0
    assert not any(line.startswith("driver") for line in lines), lines
    assert any("stopped in order: there is nothing to take over" in line for line in lines)


#: How the jobs below run: ``python JOB --dir STATE [--standby]``.
JOB_ENTRY = """

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--dir")
    parser.add_argument("--standby", action="store_true")
    args = parser.parse_args()
    otpmesh.run(main, args.dir, args.standby)
"""


def start_job(tmp_path: Path, source: str) -> tuple[Path, Path, Program]:
    """Job `source` (its ``main(state, standby)``) started as the active controller: the
    job's file, its state directory and the running program."""
    job = tmp_path / "job.py"
    job.write_text(source + JOB_ENTRY)
    state = tmp_path / "state"
    return job, state, Program(state, program=job)


def _killed_after(tmp_path: Path, source: str, ready: str) -> tuple[Path, Path]:
    """Run job `source` as the active controller until it prints `ready`, then SIGKILL it;
    the job's file and its state directory."""
    job, state, active = start_job(tmp_path, source)
    active.wait_for(ready)
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait(10)
    return job, state


FLAKY_JOB = """
import argparse, contextlib
import trio
import otpmesh
from otpmesh import Supervisor, Worker


class Flaky(otpmesh.Actor):
    @otpmesh.endpoint
    async def crash(self) -> None:
        raise RuntimeError("boom")


TREE = Supervisor("job", intensity=1, period=600.0, children=[Worker("flaky", Flaky)])


async def main(state: str, standby: bool) -> None:
    takeover = otpmesh.Takeover(dir=state, grace=60.0, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        with contextlib.suppress(otpmesh.ActorError):
            await app.actor("job/flaky").crash()
        await app.settled()
        print("restarted once", flush=True)
        if not standby:
            await trio.sleep_forever()
        # The standby's crash, handled now: with the active's restart carried over it is one
        # too many, and the root's give-up ends this block (the program exits 1).
        if app.events.of_kind("restart_intensity_reached"):
            await trio.sleep_forever()
        print("no intensity carried over", flush=True)
"""


@pytest.mark.timeout(180)
def test_a_standby_carries_each_supervisors_restart_intensity_over(tmp_path: Path) -> None:
    job, state = _killed_after(tmp_path, FLAKY_JOB, "restarted once")
    # intensity=1 within 600 s: the active's restart plus the standby's is one too many.
    standby = Program(state, "--standby", program=job)
    lines = standby.finish(status=1)
    assert not any("no intensity carried over" in line for line in lines), lines
    assert any("otpmesh: " in line and "job" in line for line in lines), lines
    assert sum("restart" in r for r in _journal(state)) >= 2


class Plain(Actor):
    pass


def test_a_core_given_a_restart_history_counts_it_toward_its_intensity() -> None:
    spec = Supervisor("s", intensity=1, period=60.0, children=[Worker("a", Plain)])
    for carried, restarts_again in (((), True), ((10.0,), False)):
        core = SupervisorCore(spec, restarts=carried)
        core.start(20.0)
        core.handle(ChildStarted("a"), 20.0)
        commands = core.handle(ChildExited("a", 1, "boom"), 30.0)
        assert any(isinstance(c, StartChild) for c in commands) is restarts_again
        assert core.restarts == (30.0, *carried)


def test_a_child_a_takeover_found_running_is_logged_as_adopted_not_started() -> None:
    """Restarts counted from the event log stay right across a takeover (before, an adopted
    actor was logged as child_started)."""
    spec = Supervisor("s", children=[Worker("a", Plain), Worker("b", Plain)])
    core = SupervisorCore(spec)
    core.start(1.0)
    core.handle(ChildStarted("a", adopted=True), 1.0)
    core.handle(ChildStarted("b"), 1.0)
    kinds = [(entry.child, entry.kind) for entry in core.take_log() if entry.child]
    assert kinds == [("a", LogKind.CHILD_ADOPTED), ("b", LogKind.CHILD_STARTED)]


COUNTER_JOB = """
import os
import trio
import otpmesh
from otpmesh import Supervisor, Worker


class Counter(otpmesh.Actor):
    def __init__(self) -> None:
        self.n = 0

    @otpmesh.endpoint
    async def bump(self) -> int:
        self.n += 1
        return self.n


TREE = Supervisor("job", children=[Worker("counter", Counter)])


async def main() -> None:
    takeover = otpmesh.Takeover(dir=os.environ["TAKEOVER_STATE"], grace=60.0)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        print("count", await app.actor("job/counter").bump(), flush=True)
        await trio.sleep(float(os.environ["TAKEOVER_HOLD"]))
"""


@pytest.mark.timeout(180)
def test_otpmesh_run_standby_waits_for_the_lease_and_takes_the_driver_over(
    tmp_path: Path,
) -> None:
    job = tmp_path / "counter_job.py"
    job.write_text(COUNTER_JOB)
    otpmesh_cmd = [sys.executable, "-m", "otpmesh", "run", "--plain"]
    env = dict(os.environ, TAKEOVER_STATE=str(tmp_path / "state"))

    def start(*flags: str, hold: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*otpmesh_cmd, *flags, f"{job}:main"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(env, TAKEOVER_HOLD=hold),
        )

    active = start("--standby", hold="600")  # a standby that finds the lease free runs the job
    assert active.stdout is not None
    next(line for line in active.stdout if line.startswith("count 1"))
    standby = start("--standby", hold="0")  # without --standby: TakeoverError, lease held
    time.sleep(1.0)
    assert standby.poll() is None  # waiting for the lease
    active.kill()
    active.wait(10)
    out, _ = standby.communicate(timeout=120)
    assert standby.returncode == 0, out
    assert "count 2" in out  # the counter kept its state across the takeover


ECHO_JOB = """
import argparse, os
import trio
import otpmesh
from otpmesh import Supervisor, Worker


class Echo(otpmesh.Actor):
    @otpmesh.endpoint
    async def say(self, text: str) -> int:
        print(text, flush=True)
        return os.getpid()


TREE = Supervisor("job", children=[Worker("echo", Echo)])


async def main(state: str, standby: bool) -> None:
    takeover = otpmesh.Takeover(dir=state, grace=60.0, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        pid = await app.actor("job/echo").say("said before the takeover")
        if not standby:
            print("ready", flush=True)
            await trio.sleep_forever()
        await app.actor("job/echo").say("said by an adopted worker")
        print(f"pid {pid}", flush=True)
        while app.which_children("job")[0].incarnation < 2:  # until its hang was noticed
            await trio.sleep(0.1)
        print("restarted after its hang", flush=True)
"""


@pytest.mark.timeout(180)
def test_an_adopted_workers_output_and_heartbeats_reach_the_standby(tmp_path: Path) -> None:
    job, state = _killed_after(tmp_path, ECHO_JOB, "ready")
    standby = Program(state, "--standby", program=job)
    standby.wait_for("[job/echo] said by an adopted worker")  # its output, prefixed, here
    pid = int(standby.said("pid ").split()[1])  # printed once that call returned
    os.kill(pid, signal.SIGSTOP)  # its heartbeats stop: the standby's watch must notice
    try:
        standby.wait_for("restarted after its hang", timeout=60)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    standby.finish()


WEDGED_JOB = """
import os
import trio
import otpmesh
from otpmesh import Supervisor, Worker


class Wedged(otpmesh.Actor):
    @otpmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @otpmesh.endpoint
    async def wedge(self) -> None:
        print("wedged", flush=True)
        await trio.sleep(600)  # past its progress deadline: it ends as hung, process alive


TREE = Supervisor("job", children=[Worker("wedged", Wedged, progress_deadline=5.0)])


async def main(state: str, standby: bool) -> None:
    takeover = otpmesh.Takeover(dir=state, grace=60.0, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        wedged = app.actor("job/wedged")
        if not standby:
            await wedged.wedge.broadcast()
            await trio.sleep_forever()
        incarnation = app.which_children("job")[0].incarnation
        print(f"incarnation {incarnation} pid {await wedged.pid()}", flush=True)
        print("exits", [e.reason_text() for e in app.events.of_kind("child_exited")], flush=True)
"""


@pytest.mark.timeout(180)
def test_an_actor_that_ended_in_a_live_process_during_the_gap_restarts_in_it(
    tmp_path: Path,
) -> None:
    job, state = _killed_after(tmp_path, WEDGED_JOB, "[job/wedged] wedged")
    pid = _journal(state)[1]["pid"]
    time.sleep(8.0)  # its deadline (5 s) passes while no controller is attached
    standby = Program(state, "--standby", program=job)
    line = standby.wait_for("incarnation ")
    assert line == f"incarnation 2 pid {pid}"  # restarted, in the process that kept running
    exits = standby.wait_for("exits ")
    assert "ended while no controller ran; its process lives on" in exits, exits
    standby.finish()


LIAR_JOB = """
import argparse, gc, os
import trio
import otpmesh
from otpmesh import Supervisor, Worker


class Liar(otpmesh.Actor):
    # An actor of the app rewrites its worker's runtime: its answer to a standby's adopt is
    # not a map of paths to incarnations.
    def __init__(self) -> None:
        from otpmesh._node._node import Node

        node = next(o for o in gc.get_objects() if isinstance(o, Node))

        async def lie(conn, payload):
            return {"actors": {"job/liar": "many"}, "rewired": False}

        node.sys_handlers["adopt"] = lie


class Counter(otpmesh.Actor):
    def __init__(self) -> None:
        self.n = 0

    @otpmesh.endpoint
    async def bump(self) -> int:
        self.n += 1
        return self.n


TREE = Supervisor("job", children=[Worker("liar", Liar), Worker("counter", Counter)])


async def main(state: str, standby: bool) -> None:
    takeover = otpmesh.Takeover(dir=state, grace=60.0, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        counter = app.actor("job/counter")
        if not standby:
            for _ in range(5):
                await counter.bump()
            print("bumped", flush=True)
            await trio.sleep_forever()
        await app.settled()
        incarnations = sorted((c.id, c.incarnation) for c in app.which_children("job"))
        print(f"counter {await counter.bump()} incarnations {incarnations}", flush=True)
"""


@pytest.mark.timeout(180)
def test_a_worker_that_answers_adopt_with_garbage_fails_alone_and_the_takeover_goes_on(
    tmp_path: Path,
) -> None:
    job, state = _killed_after(tmp_path, LIAR_JOB, "bumped")
    standby = Program(state, "--standby", program=job)
    line = standby.wait_for("counter ")
    # The counter kept its state in its adopted process; the liar's process was killed and
    # its actor started again (incarnation 2).
    assert line == "counter 6 incarnations [('counter', 1), ('liar', 2)]", line
    standby.finish()


@pytest.mark.timeout(120)
def test_a_worker_of_an_app_without_a_takeover_refuses_to_be_adopted() -> None:
    from otpmesh import start
    from otpmesh._runtime._controller_runtime import runtime

    async def body() -> None:
        tree = Supervisor("plain", children=[Worker("a", Plain)])
        async with start(tree):
            rt = await runtime()
            proc = next(iter(rt.procs.values()))
            stranger = Node("ctl", secret=rt.node.secret)  # knows the secret, as an actor does
            async with trio.open_nursery() as nursery:
                await nursery.start(stranger.serve)
                conn = await stranger.connect(proc.addr)
                payload = {"epoch": 99, "addr": stranger.addr, "pid": os.getpid()}
                with pytest.raises(ActorError, match="runs without a takeover"):
                    await stranger.sys_call(conn, "adopt", payload, proc.proc_id)
                nursery.cancel_scope.cancel()
            assert proc.alive and proc.conn is not None and not proc.conn.closed

    trio.run(body)


@pytest.mark.timeout(240)
def test_the_takeover_benchmark_reports_its_figure_beside_its_baseline() -> None:
    # A smoke test, run as a user runs it: no timing is asserted, only that the figures are there.
    done = subprocess.run(
        [sys.executable, "-m", "otpmesh.bench", "takeover", "--trials", "1"],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert len(result["takeover_s"]) == 1 and result["takeover_median_s"] > 0
    assert result["fresh_start_median_s"] > 0 and result["loadavg_1m"] >= 0
