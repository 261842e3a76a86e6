"""Several hosts: agents, authenticated TCP, broadcast through agents, host failure.

Hosts are network namespaces (tests/netns.py) where this machine can make them: real separate
network stacks, each with its own agent and workers, that a test can kill or cut off. Where it
cannot (no root, no iproute2), those tests skip saying why and the same tests run over agents on
localhost instead.
"""

from __future__ import annotations

import logging
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, LogKind, Mesh, Supervisor, launchers
from otpmesh._core._errors import ProtocolError
from otpmesh._wire import _codec
from otpmesh._wire._frames import HELLO
from otpmesh._wire._framing import frame_header
from otpmesh._wire._handshake import FLAG_FRAME_MAC, HANDSHAKE, dial
from otpmesh.testing import netns
from tests.actors import Echo
from tests.conftest import alive, run_trio, stop_notices

NETNS_UNAVAILABLE = netns.unavailable()


@pytest.fixture(autouse=True)
def cluster_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTPMESH_SECRET", "test-cluster-secret")


@pytest.fixture(scope="module")
def spaces() -> Iterator[netns.NetnsHosts | None]:
    if NETNS_UNAVAILABLE is not None:
        yield None
        return
    hosts = netns.make_hosts(4)
    try:
        yield hosts
    finally:
        hosts.remove()


@pytest.fixture(params=["netns", "localhost"])
def where(request: pytest.FixtureRequest, spaces: netns.NetnsHosts | None) -> Any:
    """How to start `n` hosts: in namespaces, or (only where those are impossible) locally."""
    if request.param == "netns" and spaces is None:
        pytest.skip(f"namespaced hosts unavailable here: {NETNS_UNAVAILABLE}")
    if request.param == "localhost" and spaces is not None:
        pytest.skip("namespaced hosts are available: the netns variant covers this")

    def open_cluster(n: int) -> Any:
        if spaces is None:
            return otpmesh.cluster(launchers.Local(hosts=n))
        launcher = launchers.Local(
            hosts=n, prefixes=spaces.prefixes()[:n], listen=spaces.listen()[:n]
        )
        return otpmesh.cluster(launcher, listen=spaces.controller_ip)

    open_cluster.spaces = spaces  # type: ignore[attr-defined]
    return open_cluster


@pytest.mark.skipif(NETNS_UNAVAILABLE is not None, reason=f"netns: {NETNS_UNAVAILABLE}")
def test_sets_of_namespaced_hosts_made_at_once_never_share_a_subnet() -> None:
    """Bridges are machine-wide: two sets on one subnet (two xdist workers, two people's runs)
    would route each other's hosts. A claim is a lock, so one process shows what two would."""
    first = netns.make_hosts(1, kind="a")
    try:
        second = netns.make_hosts(1, kind="b")
        try:
            assert first.subnet != second.subnet
            assert first.controller_ip != second.controller_ip
            with pytest.raises(RuntimeError, match=rf"subnet {first.subnet} is held by .*pid"):
                netns.make_hosts(1, subnet=first.subnet, kind="c")
        finally:
            second.remove()
    finally:
        first.remove()
    again = netns.make_hosts(1, subnet=first.subnet, kind="d")  # removed: free again
    again.remove()


def test_three_hosts_answer_broadcast_and_unicast(where: Any) -> None:
    async def main() -> None:
        async with where(3) as hosts:
            assert [h.rank for h in hosts.live] == [0, 1, 2]
            procs = await otpmesh.proc_mesh(hosts=3, procs=2)
            echo = await procs.spawn("echo", Echo)
            who = await echo.whoami()
            by_host = {(w["coords"]["hosts"], w["host"]) for w in who.values()}
            assert by_host == {(0, "local0"), (1, "local1"), (2, "local2")}
            if where.spaces is not None:  # six workers in three distinct network stacks
                assert len({w["netns"] for w in who.values()}) == 3
                assert os.readlink("/proc/self/ns/net") not in {w["netns"] for w in who.values()}
            assert (await echo.echo("x")).values() == ["x"] * 6
            assert await echo[3].echo({"one": 1}) == {"one": 1}
            with pytest.raises(otpmesh.SpawnError, match=r"hosts are 0\.\.2"):
                await otpmesh.proc_mesh(hosts=4, procs=1)
            # Actor to actor across hosts: direct, authenticated TCP between workers.
            peer = await echo[5].whoami()
            assert (await echo[0].call_peer(echo[5], 7))["value"] == 7
            assert peer["host"] == "local2"
            await procs.stop()

    run_trio(main, timeout=60)


def test_broadcast_costs_one_send_per_host(where: Any) -> None:
    """The controller sends a broadcast once per host agent, which relays it to its workers."""

    async def main() -> None:
        async with where(2) as hosts:
            procs = await otpmesh.proc_mesh(hosts=2, procs=3)
            echo = await procs.spawn("echo", Echo)
            rt_node = otpmesh._node._node.current_node()
            assert rt_node is not None
            worker_conns = [p.conn for p in procs._procs]
            before_direct = [c.next_call_id for c in worker_conns]
            before_agents = [h.conn.next_call_id for h in hosts.live]
            for _ in range(5):
                assert (await echo.echo(1)).values() == [1] * 6
            # Replies came back through each agent: 5 calls x 3 actors on each agent connection,
            # and not one call frame went to a worker directly.
            assert [
                h.conn.next_call_id - b for h, b in zip(hosts.live, before_agents, strict=True)
            ] == [15, 15]
            assert [c.next_call_id for c in worker_conns] == before_direct
            assert await echo[4].echo(2) == 2  # unicast still goes direct
            assert worker_conns[4].next_call_id == before_direct[4] + 1
            await procs.stop()

    run_trio(main, timeout=60)


def _tree(hosts: int) -> Supervisor:
    mesh = Mesh(
        "workers", Echo, shape={"hosts": hosts, "procs": 2}, strategy=ONE_FOR_ONE, intensity=10
    )
    return Supervisor("root", strategy=ONE_FOR_ONE, intensity=10, children=[mesh])


async def _host_of(app: otpmesh.App) -> dict[int, str]:
    return {r: w["host"] for r, w in enumerate((await app.mesh("root/workers").whoami()).values())}


def test_killed_host_agent_restarts_its_actors_on_the_spare(where: Any) -> None:
    async def main() -> None:
        async with where(4) as hosts, otpmesh.start(_tree(3)) as app:
            assert await _host_of(app) == {
                0: "local0",
                1: "local0",
                2: "local1",
                3: "local1",
                4: "local2",
                5: "local2",
            }
            pids = [w["pid"] for w in (await app.mesh("root/workers").whoami()).values()]
            since = len(app.events)
            launched = hosts_launcher(hosts)
            os.kill(launched.processes[1].pid, signal.SIGKILL)  # host 1's agent dies
            await app.settled()
            with trio.fail_after(30):  # hang guards, here and below: no deadline to meet
                while _restarts(app, since) < 2:
                    await trio.sleep(0.05)
            exits = [e for e in list(app.events)[since:] if e.kind == LogKind.CHILD_EXITED]
            assert {e.child_path for e in exits} == {"root/workers/2", "root/workers/3"}
            assert all("local1" in otpmesh.describe(e.reason) for e in exits), exits
            after = await _host_of(app)
            assert after[2] == after[3] == "local3"  # the spare host took them
            assert after[0] == "local0" and after[4] == "local2"  # the others kept running
            # The dead host's workers did not outlive its agent.
            with trio.fail_after(30):
                while alive(pids[2]) or alive(pids[3]):
                    await trio.sleep(0.05)

    run_trio(main, timeout=90)


def _restarts(app: otpmesh.App, since: int) -> int:
    return sum(
        e.kind == LogKind.CHILD_STARTED and (e.incarnation or 0) > 1
        for e in list(app.events)[since:]
    )


def hosts_launcher(hosts: otpmesh.Cluster) -> launchers.Local:
    launcher = hosts.launcher
    assert isinstance(launcher, launchers.Local)
    return launcher


def test_host_cut_off_is_declared_dead_and_refused_until_it_registers_again(where: Any) -> None:
    """Cut off: its link goes down (namespaces), or its agent is SIGSTOPped (localhost)."""
    spaces: netns.NetnsHosts | None = where.spaces

    def cut(hosts: otpmesh.Cluster, i: int, off: bool) -> None:
        if spaces is not None:
            (spaces.cut if off else spaces.reconnect)(i)
        else:
            os.kill(
                hosts_launcher(hosts).processes[i].pid, signal.SIGSTOP if off else signal.SIGCONT
            )

    async def main() -> None:
        async with where(3) as hosts, otpmesh.start(_tree(2)) as app:
            old = hosts.live[1]
            pids = [w["pid"] for w in (await app.mesh("root/workers").whoami()).values()]
            since = len(app.events)
            cut_at = trio.current_time()
            cut(hosts, 1, True)
            with trio.fail_after(30):  # hang guards: how fast is printed, not asserted
                while old.alive:
                    await trio.sleep(0.02)
            detected = trio.current_time() - cut_at
            assert "stopped answering" in str(old.dead_reason)
            with trio.fail_after(30):
                while _restarts(app, since) < 2:
                    await trio.sleep(0.05)
            after = await _host_of(app)
            assert after[2] == after[3] == "local2"  # moved to the spare
            # The cut-off agent fenced its own workers: no actor runs twice.
            with trio.fail_after(30):
                while alive(pids[2]) or alive(pids[3]):
                    await trio.sleep(0.05)
            cut(hosts, 1, False)
            with trio.fail_after(30):
                while len(hosts.live) < 3:
                    await trio.sleep(0.1)
            back = next(h for h in hosts.live if h.name == "local1")
            assert back.rank == 1 and back.host_id != old.host_id and not old.alive
            # The old registration stays refused: a hello in its name is answered by a close.
            sock, mac = await dial(hosts.address, b"test-cluster-secret")
            assert mac is not None  # TCP frames carry a MAC: seal this one as a node would
            hello = _codec.pack([HELLO, {"agent": "local1", "host_id": old.host_id}])
            tag = mac.seal((hello,))
            sock.sendall(frame_header(len(hello) + len(tag)) + hello + tag)
            await trio.lowlevel.wait_readable(sock)
            assert sock.recv(4096) == b""
            sock.close()
            print(f"host cut off: declared dead after {detected:.2f} s")

    run_trio(main, timeout=90)


def test_a_peer_without_the_secret_gets_nothing(
    where: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with where(1) as hosts:
            addr = hosts.address
            with pytest.raises(ProtocolError, match="refused this node's secret"):
                await dial(addr, b"not the secret")
            # By hand: the handshake, then garbage for a proof. Nothing comes back but the nonce.
            host, port = addr[4:].rsplit(":", 1)
            sock = trio.socket.socket()
            await sock.connect((host, int(port)))
            # (TCP frames carry a MAC: the handshake says so, or it is refused at once.)
            await sock.send(HANDSHAKE[:-2] + struct.pack(">H", FLAG_FRAME_MAC))
            await sock.send(b"\0" * 64)
            got = b""
            while chunk := await sock.recv(4096):
                got += chunk
            assert len(got) == len(HANDSHAKE) + 32  # handshake echo + nonce; then closed
            sock.close()
            good, _ = await dial(addr, b"test-cluster-secret")
            good.close()

    with caplog.at_level("WARNING", logger="otpmesh.node"):
        run_trio(main, timeout=60)
    assert any("wrong secret" in r.getMessage() for r in caplog.records)


def test_an_agent_with_the_wrong_secret_does_not_register(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def refused() -> bool:
        return any("wrong secret" in r.getMessage() for r in caplog.records)

    class WrongSecret(launchers.Local):
        async def start(self, controller: str, secret: bytes) -> None:
            await super().start(controller, b"wrong")
            # The registration wait starts only once the agent has dialed and been turned away,
            # so however slowly it starts up, the 3 s below are spent refusing it.
            with trio.fail_after(30):
                while not refused():
                    await trio.sleep(0.05)

    async def main() -> None:
        with pytest.raises(
            otpmesh.SpawnError, match=r"only 0 of 1 host agents registered within 3 s"
        ):
            async with otpmesh.cluster(WrongSecret(hosts=1), timeout=3):
                pass

    with caplog.at_level("WARNING", logger="otpmesh.node"):
        run_trio(main, timeout=60)


def _fake_tool(tmp_path: Any, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_ssh_launcher_runs_agents_through_ssh_with_the_secret_on_stdin(tmp_path: Any) -> None:
    """A stand-in for ssh (it records its argv and runs the remote command here): the launcher
    is tested end to end with real agent processes; only the remote login is skipped."""
    ssh = _fake_tool(
        tmp_path,
        "ssh",
        f'echo "$@" >> {tmp_path}/argv\n'
        'while [ "$1" = "-o" ]; do shift 2; done\n'
        "shift\n"  # the host name
        'exec sh -c "$1"\n',
    )
    agent = (sys.executable, "-m", "otpmesh._hosts._agent")

    async def main() -> None:
        launcher = launchers.SSH(["gpu-a", "gpu-b"], ssh=(ssh, "-o", "BatchMode=yes"), agent=agent)
        async with otpmesh.cluster(launcher) as hosts:
            assert [h.name for h in hosts.live] == ["gpu-a", "gpu-b"]
            procs = await otpmesh.proc_mesh(hosts=2, procs=1)
            echo = await procs.spawn("echo", Echo)
            assert [w["host"] for w in (await echo.whoami()).values()] == ["gpu-a", "gpu-b"]
            await procs.stop()

    run_trio(main, timeout=60)
    argv = (tmp_path / "argv").read_text()
    assert "gpu-a" in argv and "--controller tcp:127.0.0.1:" in argv
    assert "test-cluster-secret" not in argv  # never on a command line


def test_slurm_launcher_starts_one_srun_step_per_node(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in for srun that runs its one task here, as node --relative=N would (the real
    srun on a real Slurm cluster: tests/test_slurm.py)."""
    srun = _fake_tool(
        tmp_path,
        "srun",
        f'echo "$@" >> {tmp_path}/argv\n'
        'while true; do case "$1" in --relative=*) n="${1#--relative=}"; shift;; -*) shift;; '
        "*) break;; esac; done\n"
        # Node 1 registers first: its rank must still be its own, not its arrival order.
        '[ "$n" = 0 ] && sleep 0.5\n'
        'exec "$@" --name node$n\n',
    )
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    agent = (sys.executable, "-m", "otpmesh._hosts._agent")

    async def main() -> None:
        async with otpmesh.cluster(launchers.Slurm(srun=(srun,), agent=agent)) as hosts:
            assert [(h.rank, h.name) for h in hosts.live] == [(0, "node0"), (1, "node1")]
            procs = await otpmesh.proc_mesh(hosts=2, procs=1)
            echo = await procs.spawn("echo", Echo)
            assert (await echo.echo(5)).values() == [5, 5]
            await procs.stop()

    run_trio(main, timeout=60)
    argv = (tmp_path / "argv").read_text()
    assert "--nodes=1 --ntasks=1 --relative=0 --kill-on-bad-exit=0" in argv
    assert "--relative=1" in argv and "--secret-stdin" in argv
    assert "test-cluster-secret" not in argv


def test_static_cluster_waits_for_agents_started_elsewhere() -> None:
    """Static: the controller starts nothing; here the test starts the agents by hand, as a
    Kubernetes pod spec would (the secret comes from the environment)."""
    agents: list[trio.Process] = []

    async def start_agents() -> None:
        while True:  # the address is known once the controller listens
            node = otpmesh._node._node.current_node()
            if node is not None and node.tcp_addr:
                break
            await trio.sleep(0.01)
        addr = node.tcp_addr
        # One through the command line, one through the Python call.
        command = [sys.executable, "-m", "otpmesh", "agent", "--controller", addr, "--rank", "0"]
        call = f"from otpmesh import launchers; launchers.run_agent({addr!r}, rank=1)"
        for argv in (command, [sys.executable, "-c", call]):
            agents.append(await trio.lowlevel.open_process(argv))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(start_agents)
            async with otpmesh.cluster(launchers.Static(hosts=2)) as hosts:
                assert len(hosts.live) == 2
                procs = await otpmesh.proc_mesh(hosts=2, procs=1)
                echo = await procs.spawn("echo", Echo)
                assert (await echo.echo(1)).values() == [1, 1]
                await procs.stop()
            for agent in agents:
                with trio.fail_after(30):
                    await agent.wait()  # shut down by the controller

    run_trio(main, timeout=60)


_CONTROLLER = """
import os, trio, otpmesh
from otpmesh import launchers
from tests.actors import Echo

async def main():
    launcher = launchers.Local(hosts=2)
    async with otpmesh.cluster(launcher):
        procs = await otpmesh.proc_mesh(hosts=2, procs=1)
        mesh = await procs.spawn("w", Echo)
        workers = [w["pid"] for w in (await mesh.whoami()).values()]
        agents = [p.pid for p in launcher.processes]
        print("pids", *workers, *agents, flush=True)
        await trio.sleep(60)

if __name__ == "__main__":
    otpmesh.run(main)
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_no_agent_or_worker_outlives_its_controller(tmp_path: Any, how: str) -> None:
    script = tmp_path / "controller.py"
    script.write_text(_CONTROLLER)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("pids"), line + (proc.stderr.read() if proc.stderr else "")
    pids = [int(p) for p in line.split()[1:]]
    assert len(pids) == 4 and all(alive(p) for p in pids)
    proc.send_signal(getattr(signal, how))
    _, err = proc.communicate(timeout=20)
    if how == "SIGINT":
        assert proc.returncode == 130
        stop_notices(err)
    deadline = time.monotonic() + 30  # a hang guard
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == []


def test_a_held_controller_loop_is_named_in_the_log(
    where: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A driver's synchronous step that holds the controller's event loop is logged with its
    remedy: heartbeats go on (test_lifeline.py), but calls, replies and restarts wait."""

    async def main() -> None:
        async with where(1):
            await trio.sleep(0.3)  # the watch's first rounds
            time.sleep(0.6)  # a driver's synchronous step, past 0.375 s (+ at most 0.1 s asleep)
            await trio.sleep(0.3)

    with caplog.at_level(logging.WARNING, logger="otpmesh"):
        run_trio(main, timeout=60)
    assert "the controller's event loop was held for" in caplog.text
    assert "trio.to_thread.run_sync" in caplog.text
