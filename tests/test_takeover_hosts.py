"""A takeover across hosts (docs/guides/takeover.md, "Across hosts"): the active controller,
its standby and two host agents each in a network namespace of their own, 4 workers holding
state, a driver loop running. The active controller is SIGKILLed, or its host cut off; the
standby takes the agents and their workers over, every actor keeps its state value by value,
none is restarted, and the old controller never drives an actor after the takeover."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from otpmesh._hosts._hostover import GIVE_UP_STATUS
from otpmesh.testing import netns
from tests.conftest import SLOWDOWN, alive, free_port

NETNS_UNAVAILABLE = netns.unavailable()
needs_netns = pytest.mark.skipif(NETNS_UNAVAILABLE is not None, reason=f"{NETNS_UNAVAILABLE}")

JOB = str(Path(__file__).with_name("hosts_takeover_job.py"))
PORT = 7391
STEPS = 60


@pytest.fixture(scope="module")
def spaces() -> Iterator[netns.NetnsHosts | None]:
    if NETNS_UNAVAILABLE is not None:
        yield None
        return
    hosts = netns.make_hosts(4)  # 0: the active controller, 1: the standby, 2 and 3: agents
    try:
        yield hosts
    finally:
        hosts.remove()


def _wait(what: str, predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout * SLOWDOWN
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _read(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Run:
    """The four processes of one run, and where their results land."""

    def __init__(
        self, spaces: netns.NetnsHosts, tmp: Path, *, standby: bool = True, grace: float = 30.0
    ) -> None:
        self.spaces, self.tmp = spaces, tmp
        self.out = tmp / "report.json"
        env = dict(os.environ, OTPMESH_SECRET="test-cluster-secret", PYTHONUNBUFFERED="1")
        controllers = f"tcp:{spaces.ip(0)}:{PORT},tcp:{spaces.ip(1)}:{PORT}"
        self.agents = []
        for rank in (0, 1):
            argv = [*spaces.prefixes()[2 + rank], sys.executable, "-m", "otpmesh", "agent"]
            argv += ["--controller", controllers, "--rank", str(rank), "--name", f"host{rank}"]
            self.agents.append(subprocess.Popen(argv, env=env))
        state = tmp / "state"
        self.controllers = []
        for i in (0, 1) if standby else (0,):
            argv = [*spaces.prefixes()[i], sys.executable, JOB, "--dir", str(state)]
            argv += ["--listen", spaces.ip(i), "--port", str(PORT), "--out", str(self.out)]
            argv += ["--grace", str(grace), *(["--standby"] if i else [])]
            with open(tmp / f"controller{i}.err", "wb") as err:
                self.controllers.append(subprocess.Popen(argv, env=env, stderr=err))
            if i == 0:  # the standby comes once the active one runs the tree
                _wait("the active controller's first step", self.progress_at_least(1), 120)

    def __enter__(self) -> subprocess.Popen[bytes]:
        """The active controller, once its driver is past step 10."""
        _wait("step 10", self.progress_at_least(10), 60)
        return self.controllers[0]

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def progress_at_least(self, n: int) -> object:
        return lambda: (_read(self.tmp / "report.json.progress") or 0) >= n

    def start_states(self, pid: int) -> list[dict[str, object]]:
        states = _read(self.tmp / f"report.json.{pid}.start")
        assert isinstance(states, list), f"no start states from pid {pid}"
        return states

    def stop(self) -> None:
        for proc in [*self.controllers, *self.agents]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _check_the_takeover(run: Run, old: subprocess.Popen[bytes]) -> None:
    active, standby = run.controllers
    assert standby.wait(120 * SLOWDOWN) == 0, (run.tmp / "controller1.err").read_text()
    report = _read(run.out)
    assert isinstance(report, dict) and report["controller"] == standby.pid
    before = run.start_states(active.pid)
    after_start = run.start_states(standby.pid)
    # No actor restarted: the same 4 processes before and after, every one still counting.
    pids = sorted(s["pid"] for s in before)
    assert len(set(pids)) == 4
    err = (run.tmp / "controller1.err").read_text()
    assert sorted(s["pid"] for s in report["states"]) == pids, err
    assert min(s["step"] for s in after_start) >= 10  # it resumed where the active one was
    # Value by value: every step applied exactly once, in order, in the same process.
    for state in report["states"]:
        assert state["step"] == STEPS
        assert state["total"] == sum(range(STEPS))
        senders = [sender for _, sender in state["seen"]]
        # The old controller never drove an actor after the takeover: its calls all come
        # before the standby's first.
        first_new = senders.index(standby.pid)
        assert set(senders[:first_new]) == {active.pid}
        assert set(senders[first_new:]) == {standby.pid}
        applied = sorted({step for step, _ in state["seen"]})
        assert applied == list(range(STEPS))
    # The old controller is gone, and so is everything else: the standby stopped the tree in
    # order, and its agents with it.
    assert old.poll() is not None and not alive(active.pid)
    for agent in run.agents:
        assert agent.wait(30 * SLOWDOWN) == 0
    _wait("every worker to exit", lambda: not any(alive(p) for p in pids), 10)


@needs_netns
def test_standby_takes_the_agents_over_when_the_active_controller_is_sigkilled(
    spaces: netns.NetnsHosts, tmp_path: Path
) -> None:
    with (run := Run(spaces, tmp_path)) as active:
        os.kill(active.pid, signal.SIGKILL)
        active.wait()
        _check_the_takeover(run, active)


@needs_netns
def test_a_partitioned_active_controller_gives_up_and_the_standby_takes_over(
    spaces: netns.NetnsHosts, tmp_path: Path
) -> None:
    with (run := Run(spaces, tmp_path)) as active:
        spaces.cut(0)  # its host leaves the network: nothing is told, no connection closes
        try:
            _wait(
                "the standby's start",
                lambda: (run.tmp / f"report.json.{run.controllers[1].pid}.start").exists(),
                60,
            )
        finally:
            spaces.reconnect(0)  # the partition heals
        assert active.wait(30 * SLOWDOWN) == GIVE_UP_STATUS
        err = (tmp_path / "controller0.err").read_text()
        assert re.search(r"is cut off from [12] of its 2 hosts", err), err
        # It still held the flock lease when the standby took over: the hosts were the
        # standby's witnesses, and the old one learnt of the new epoch, and gave up.
        assert "fenced: a controller at epoch 2 took the app over" in err, err
        _check_the_takeover(run, active)


@needs_netns
def test_without_a_standby_the_agents_kill_their_workers_when_the_grace_ends(
    spaces: netns.NetnsHosts, tmp_path: Path
) -> None:
    """Nobody takes over: each agent keeps its workers for the grace period, then kills them,
    and goes on as an agent without a controller (registering afresh): nothing is orphaned."""
    grace = 4.0
    with (run := Run(spaces, tmp_path, standby=False, grace=grace)) as active:
        pids = [s["pid"] for s in run.start_states(active.pid)]
        os.kill(active.pid, signal.SIGKILL)
        killed = time.monotonic()
        active.wait()
        time.sleep(1.0)
        assert all(alive(p) for p in pids)  # kept for a standby meanwhile (not AGENT_TIMEOUT)
        _wait("every worker to exit", lambda: not any(alive(p) for p in pids), grace + 10)
        assert time.monotonic() - killed >= grace
        assert all(agent.poll() is None for agent in run.agents)  # the agents stay


def test_an_agent_waiting_for_a_standby_serves_only_a_higher_epoch() -> None:
    """The fencing rule of an agent whose controller is gone, on a real Agent and a real
    control pipe (no network needed): the same epoch is hung up on and its workers are not
    touched; a higher one is served, and each worker is told to drop the old controller."""
    from otpmesh._hosts._agent import Agent, _Proc
    from otpmesh._runtime._watchdog import fence_request
    from otpmesh._runtime._workerpipes import WorkerPipes

    class Conn:
        reason: str | None = None

        def abort(self, reason: str) -> None:
            self.reason = reason

    async def main() -> None:
        agent = Agent("tcp:127.0.0.1:1,tcp:127.0.0.1:2", b"secret")
        assert agent.controllers == ["tcp:127.0.0.1:1", "tcp:127.0.0.1:2"]
        beat_r, beat_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        proc = _Proc("p1")
        proc.pid, proc.pipes = os.getpid(), WorkerPipes(beat_r, ctl_w, lambda report: None)
        agent.procs["p1"] = proc
        agent.grace.on_takeover({"epoch": 2, "grace": 5.0})  # registered: serves epoch 2
        agent.conn = stale = Conn()  # type: ignore[assignment]
        agent.grace.on_takeover({"epoch": 2, "grace": 5.0})
        assert stale.reason is None  # not waiting: its own controller, telling it again
        assert agent.grace.keeps_workers()  # the controller is lost: the wait begins
        assert agent.grace.hello()["resume"] == {"epoch": 2, "procs": {"p1": os.getpid()}}
        agent.grace.on_takeover({"epoch": 2, "grace": 5.0})  # the old one, back
        assert stale.reason is not None and "fenced" in stale.reason
        assert agent.grace.waiting and agent.grace.epoch == 2
        os.set_blocking(ctl_r, False)
        with pytest.raises(BlockingIOError):
            os.read(ctl_r, 64)  # its workers were not touched
        agent.conn = standby = Conn()  # type: ignore[assignment]
        agent.grace.on_takeover({"epoch": 3, "grace": 5.0})
        assert standby.reason is None and agent.grace.epoch == 3 and not agent.grace.waiting
        assert os.read(ctl_r, 64) == fence_request(3)
        for fd in (beat_r, beat_w, ctl_r, ctl_w):
            os.close(fd)

    trio.run(main)


@needs_netns
def test_bench_takeover_has_a_hosts_variant() -> None:
    """``python -m otpmesh.bench takeover --hosts``: a SIGKILL and a partition, one trial each
    (in namespaces of its own; the figures are not asserted: a benchmark's, not a test's)."""
    done = subprocess.run(
        [sys.executable, "-m", "otpmesh.bench", "takeover", "--hosts", "--trials", "1"],
        capture_output=True,
        text=True,
        timeout=240 * SLOWDOWN,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for fault in ("sigkill", "partition"):
        assert figures[fault]["trials"] == 1
        assert 0 < figures[fault]["takeover_median_s"] < figures[fault]["fresh_start_median_s"] * 10


def test_a_standby_that_does_not_take_over_cannot_keep_an_agents_workers_past_the_grace(
    tmp_path: Path,
) -> None:
    """A standby that never takes over (a minority of the hosts came to it: the active
    controller still holds its place for the rest) beats to the agents that came to it, so they
    never time out on it. Their workers must still go when the grace period ends: the active
    controller declares their host dead after HOST_TIMEOUT + grace and restarts their actors
    elsewhere, taking them for killed (before, they ran on, a second copy of each actor).

    Real processes on loopback, no namespaces: the active controller is SIGSTOPped (it holds
    the lease, silently); host0's agent knows the standby and waits there, host1's knows only
    the active controller, so the standby sees 1 of 2 hosts and waits."""
    grace = 3.0
    ports = [free_port(), free_port()]
    a, b = (f"tcp:127.0.0.1:{port}" for port in ports)
    env = dict(os.environ, OTPMESH_SECRET="test-cluster-secret", PYTHONUNBUFFERED="1")
    out, state = tmp_path / "report.json", tmp_path / "state"
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], err: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / err, "wb") as f:
            procs.append(subprocess.Popen([sys.executable, *argv], env=env, stderr=f))
        return procs[-1]

    try:
        for rank, controllers in ((0, f"{a},{b}"), (1, a)):
            argv = ["-m", "otpmesh", "agent", "--controller", controllers, "--rank", str(rank)]
            start([*argv, "--name", f"host{rank}"], f"agent{rank}.err")
        for i, port in enumerate(ports):
            argv = [JOB, "--dir", str(state), "--listen", "127.0.0.1", "--port", str(port)]
            argv += ["--out", str(out), "--grace", str(grace), "--steps", "100000"]
            start([*argv, *(["--standby"] if i else [])], f"controller{i}.err")
            if i == 0:
                _wait(
                    "the active controller's first step",
                    lambda: _read(Path(f"{out}.progress")),
                    120,
                )
        pids = [s["pid"] for s in _read(Path(f"{out}.{procs[2].pid}.start"))]  # type: ignore[union-attr]
        time.sleep(1.0)  # the standby reads the journal and listens (JOURNAL_POLL)
        os.kill(procs[2].pid, signal.SIGSTOP)
        time.sleep(1.0)
        assert all(alive(p) for p in pids)  # kept for a standby meanwhile
        _wait("every worker to exit", lambda: not any(alive(p) for p in pids), grace + 15)
        assert procs[3].poll() is None  # the standby never took over: it still waits
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
