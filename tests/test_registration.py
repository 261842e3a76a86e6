"""Registration is tied to the fork (docs/security.md): a worker's HELLO carries the one-time
token its fork request gave it and, on one host, comes from the pid forked for it; a host
agent's carries its launcher's token. A compromised actor that knows the secret sends HELLOs in
its siblings' names while one restarts: each is refused with nothing sent back, and the real
worker registers and answers. Real processes, real sockets, real signals."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import otpmesh
from otpmesh import LogKind, Mesh, Supervisor, launchers
from otpmesh._hosts._agentgrace import MAX_RESUMED
from otpmesh._runtime._controller_runtime import Runtime, runtime
from otpmesh._runtime._proc import Proc
from tests.actors import Echo, Forger, Member
from tests.conftest import free_port, run_trio


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("PPid:"))


@contextmanager
def _stopped(pid: int) -> Iterator[None]:
    """`pid` (the fork server) is SIGSTOPped inside the block: it forks nothing meanwhile."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def _pending(rt: Runtime, known: set[str]) -> Proc:
    """The worker process the controller is waiting for, not one of `known` (a hang guard)."""
    with trio.fail_after(30):
        while True:
            fresh = [p for p in rt.procs.values() if p.proc_id not in known and p.alive]
            if fresh:
                return fresh[0]
            await trio.sleep(0.01)


def test_forged_hellos_for_a_restarting_sibling_are_refused_and_it_restarts() -> None:
    tree = Supervisor(
        "root",
        children=[
            Mesh("victim", Member, shape={"procs": 1}, intensity=3),
            Mesh("forger", Forger, shape={"procs": 1}),
        ],
    )

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            rt = await runtime()
            victim, forger = app.mesh("root/victim"), app.mesh("root/forger")
            old_pid = await victim[0].pid()
            me = await forger[0].pid()
            known = set(rt.procs)
            # The fork server is held still, so the forger is sure to speak while the
            # controller waits for the sibling's new worker (an attacker races it instead).
            fork_server = _parent(old_pid)
            with _stopped(fork_server):
                os.kill(old_pid, signal.SIGKILL)
                new = await _pending(rt, known)
                token = new.token
                assert token is not None and new.conn is None
                ids = sorted({*known, new.proc_id, *(f"p{i}" for i in range(1, 13))})
                hello: dict[str, Any] = {"pid": me, "addr": "@forged"}
                for proc_id in ids:  # what the attacker sent: no token, or a guessed one
                    for forged in ({}, {"token": b"\0" * 32}, {"token": "\u00e9" * 32}):
                        payload = dict(hello, proc=proc_id, **forged)
                        assert await forger[0].hello(rt.node.addr, payload) == "nothing"
                assert new.token == token and new.conn is None  # untouched, still expected

                # Even the right token (read from the new process's memory, say) is refused
                # from any pid but the one forked for it. Decided once the fork is reported.
                async def stolen() -> None:
                    payload = dict(hello, proc=new.proc_id, token=token)
                    assert await forger[0].hello(rt.node.addr, payload) == "nothing"

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stolen)
                    with trio.fail_after(30):  # a hang guard: until it waits for the fork
                        while new.forked.statistics().tasks_waiting == 0:
                            await trio.sleep(0.01)
                    os.kill(fork_server, signal.SIGCONT)  # the real worker is forked now
            with trio.fail_after(30):  # a hang guard
                await new.ready.wait()
            assert new.conn is not None and new.token is None  # registered, token spent
            assert new.pid not in (0, me) and await victim[0].pid() == new.pid
            assert await victim[0].ping() == "root/victim/0"
            await app.settled()
            started = [
                (e.child_path, e.incarnation) for e in app.events.of_kind(LogKind.CHILD_STARTED)
            ]
            assert ("root/victim/0", 2) in started, started
            assert await forger[0].pid() == me  # the forger's own worker was never disturbed

    run_trio(body, timeout=120)


@pytest.fixture
def cluster_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTPMESH_SECRET", "test-cluster-secret")


def test_a_forged_agent_hello_is_refused_and_the_real_agent_keeps_working(
    cluster_secret: None, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with otpmesh.cluster(launchers.Local(hosts=1)) as hosts:
            [real] = hosts.live
            procs = await otpmesh.proc_mesh(hosts=1, procs=1)
            # A compromised actor on the host: its worker holds the cluster's secret.
            forger = await procs.spawn("forger", Forger)
            agent = {"agent": "local0", "pid": 1, "listen": "127.0.0.1"}
            for forged in (
                {"host_id": "f1", "rank": 0},  # in the live host's place
                {"host_id": "f2", "rank": 0, "token": b"\0" * 64},
                {"host_id": "f3", "rank": 0, "token": "\u00e9"},
                {"host_id": "f4", "rank": 1},  # a host the launcher never started
                {"host_id": "f5"},
                {"host_id": real.host_id, "rank": 0},  # the live host's own identity
            ):
                assert await forger[0].hello(hosts.address, dict(agent, **forged)) == "nothing"
            assert hosts.live == [real] and hosts.hosts == [real] and real.alive
            assert not real.conn.closed
            echo = await procs.spawn("echo", Echo)  # the real agent still forks and relays
            assert (await echo.echo("agent answers")).values() == ["agent answers"]
            more = await otpmesh.proc_mesh(hosts=1, procs=1)
            assert (await (await more.spawn("e2", Echo)).echo(2)).values() == [2]

    with caplog.at_level(logging.WARNING, logger="otpmesh.node"):
        run_trio(body, timeout=90)
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert refusals and "agent HELLO" in refusals[0], refusals
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_malformed_resume_hello_registers_nothing_and_raises_nothing(
    cluster_secret: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Where agents hold no token (a ``Static`` launcher's, a takeover standby's), a holder of
    the secret may register as a further host; the processes a resume HELLO says it still runs
    (_agentgrace.py) are checked before anything registers: pids that are not ints, or more of
    them than a host runs, are a refusal. Before, a pid of another type raised in the middle of
    the registration: a host was registered half-way, the connection closed with a traceback
    logged at ERROR, once per HELLO (not rate-limited)."""
    port = free_port()

    async def body() -> None:
        argv = [sys.executable, "-m", "otpmesh", "agent", "--controller", f"tcp:127.0.0.1:{port}"]
        agent = subprocess.Popen([*argv, "--rank", "0", "--name", "static0"])
        try:
            async with otpmesh.cluster(launchers.Static(hosts=1), port=port) as hosts:
                [real] = hosts.live
                procs = await otpmesh.proc_mesh(hosts=1, procs=1)
                forger = await procs.spawn("forger", Forger)
                agent_hello = {"agent": "forged", "pid": 1, "listen": "127.0.0.1", "rank": 3}
                for i, procs_ran in enumerate(
                    (
                        {"p1": "x"},
                        {"p1": None},
                        {"p1": 1.5},
                        {"p1": True},
                        {f"p{n}": n for n in range(MAX_RESUMED + 1)},
                    )
                ):
                    resume = {"epoch": 1, "procs": procs_ran}
                    forged = dict(agent_hello, host_id=f"f{i}", resume=resume)
                    assert await forger[0].hello(hosts.address, forged) == "nothing"
                assert hosts.hosts == [real] and real.alive
        finally:
            agent.kill()
            agent.wait()

    with caplog.at_level(logging.WARNING, logger="otpmesh"):
        run_trio(body, timeout=90)
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert refusals and "resume" in refusals[0], refusals
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_takeover_runs_agents_register_only_with_their_launchers_tokens(
    cluster_secret: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``Takeover(..., hosts=TakeoverHosts(launchers.Local(...)))`` starts its agents with the
    launcher's one-time tokens, as ``otpmesh.cluster`` does: a compromised actor's HELLO as a
    further host is refused with nothing sent back. Before, a takeover run never asked its
    launcher for tokens, so its controller registered any holder of the secret as a host (and
    told it the fencing epoch and grace), and every later spawn could land on it."""
    tree = Supervisor("job", children=[Mesh("forger", Forger, shape={"hosts": 1, "procs": 1})])
    hosts = otpmesh.TakeoverHosts(launchers.Local(hosts=1))

    async def body() -> None:
        takeover = otpmesh.Takeover(dir=str(tmp_path / "state"), grace=5.0, hosts=hosts)
        async with otpmesh.start(tree, takeover=takeover) as app:
            rt = await runtime()
            assert rt.cluster is not None
            [real] = rt.cluster.live
            forger = app.mesh("job/forger")
            forged = {"agent": "forged", "pid": 1, "listen": "127.0.0.1", "host_id": "f1"}
            for rank in (1, None):
                hello = forged if rank is None else dict(forged, rank=rank)
                assert await forger[0].hello(rt.cluster.address, hello) == "nothing"
            assert rt.cluster.hosts == [real] and real.alive

    with caplog.at_level(logging.WARNING, logger="otpmesh.node"):
        run_trio(body, timeout=120)
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert refusals and "agent HELLO" in refusals[0], refusals


_STANDBY = """
import sys
import otpmesh
from otpmesh import Mesh, Supervisor, launchers
from tests.actors import Forger

tree = Supervisor("job", children=[Mesh("forger", Forger, shape={"hosts": 1, "procs": 1})])
hosts = otpmesh.TakeoverHosts(launchers.Local(hosts=1), port=int(sys.argv[2]))
takeover = otpmesh.Takeover(dir=sys.argv[1], grace=5.0, standby=True, hosts=hosts)

async def main():
    async with otpmesh.start(tree, takeover=takeover):
        pass

otpmesh.run(main)
"""


def test_a_standby_registers_only_the_agents_holding_the_journalled_tokens(
    cluster_secret: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The active controller journals each rank's registration tokens; its standby, listening
    for the agents that lose their controller, registers only their holders. A compromised
    actor (it holds the secret) sending a standby an agent HELLO is refused with nothing sent
    back, as it is by the active controller; the journalled token is accepted (the standby
    checks tokens, it does not refuse every agent). Before, a standby checked the secret
    alone: the actor registered, as a host the standby would count, relay through and spawn
    on (docs/security.md)."""
    from otpmesh._controller._lastrun import last_run
    from otpmesh._runtime._journal import read_journal

    tree = Supervisor("job", children=[Mesh("forger", Forger, shape={"hosts": 1, "procs": 1})])
    state, port = tmp_path / "state", free_port()

    async def body() -> None:
        hosts = otpmesh.TakeoverHosts(launchers.Local(hosts=1))
        takeover = otpmesh.Takeover(dir=str(state), grace=5.0, hosts=hosts)
        async with otpmesh.start(tree, takeover=takeover) as app:
            rt = await runtime()
            assert rt.cluster is not None and rt.cluster.tokens is not None
            tokens = last_run(read_journal(state)).tokens
            assert tokens[0][0] == rt.cluster.tokens[0]  # the token the agent holds now
            argv = [sys.executable, "-c", _STANDBY, str(state), str(port)]
            root = str(Path(__file__).parent.parent)
            env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
            standby = subprocess.Popen(argv, env=env)
            try:
                with trio.fail_after(60):  # a hang guard: it listens once it read the journal
                    while True:
                        try:
                            await (await trio.open_tcp_stream("127.0.0.1", port)).aclose()
                            break
                        except OSError:
                            await trio.sleep(0.05)
                addr = f"tcp:127.0.0.1:{port}"
                forger = app.mesh("job/forger")
                forged = {"agent": "forged", "pid": 1, "listen": "127.0.0.1", "rank": 0}
                assert await forger[0].hello(addr, dict(forged, host_id="f1")) == "nothing"
                wrong = dict(forged, host_id="f2", token=bytes(32))
                assert await forger[0].hello(addr, wrong) == "nothing"
                right = dict(forged, host_id="f3", token=tokens[0][0])
                assert await forger[0].hello(addr, right) != "nothing"
            finally:
                standby.kill()
                standby.wait()
            assert rt.cluster.live and rt.cluster.live[0].host_id != "f3"

    with caplog.at_level(logging.WARNING, logger="otpmesh.node"):
        run_trio(body, timeout=180)
