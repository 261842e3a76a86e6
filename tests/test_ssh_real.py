"""launchers.SSH over real ssh: an sshd in each of three namespaced hosts (otpmesh.testing.sshd),
key-based login, the agents started by the real ``ssh`` client. No stand-ins (the stand-in test in
test_multihost.py is the fast path).

Slow (sshd hosts, a cluster): ``bash .ci/dev slurm`` runs them, installing openssh-server where it
can.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, LogKind, Mesh, Supervisor, launchers
from otpmesh.testing import sshd
from tests.actors import Echo
from tests.conftest import run_trio

pytestmark = pytest.mark.slow

UNAVAILABLE = sshd.unavailable()
SECRET = "real-ssh-secret-" + os.urandom(8).hex()
NUL = b"\0"


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[sshd.SshHosts]:
    if UNAVAILABLE is not None:
        pytest.skip(f"no sshd hosts here: {UNAVAILABLE}")
    monkeypatch.setenv("OTPMESH_SECRET", SECRET)
    started = sshd.start(3)
    try:
        yield started
    finally:
        started.stop()


def _processes_showing(text: str, where: str) -> list[str]:
    """Every process whose `where` (cmdline, environ) holds `text`, on this machine: both the
    controller's side and the namespaced hosts' (one pid namespace)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                data = Path(f"/proc/{entry}/{where}").read_bytes()
            except OSError:
                continue
            if text.encode() in data:
                found.append(f"{entry}: {data.replace(NUL, b' ')[:200]!r}")
    return found


def _in_netns(servers: sshd.SshHosts, i: int, text: str) -> list[int]:
    want = os.stat(servers.hosts.net(i)).st_ino
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                inode = os.stat(f"/proc/{entry}/ns/net").st_ino
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if inode == want and text.encode() in cmd:
                pids.append(int(entry))
    return pids


@pytest.mark.timeout(180)
def test_three_hosts_over_real_ssh_and_a_dropped_connection_is_a_lost_host(
    servers: sshd.SshHosts,
) -> None:
    addresses = servers.addresses()
    launcher = launchers.SSH(
        addresses, ssh=servers.ssh_command(), agent=(sys.executable, "-m", "otpmesh._hosts._agent")
    )
    mesh = Mesh("workers", Echo, shape={"hosts": 3, "procs": 1}, strategy=ONE_FOR_ONE)
    tree = Supervisor("root", strategy=ONE_FOR_ONE, intensity=5, children=[mesh])

    async def main() -> None:
        cluster = otpmesh.cluster(launcher, listen=servers.hosts.controller_ip)
        async with cluster as hosts, otpmesh.start(tree) as app:
            assert [h.name for h in hosts.live] == addresses
            workers = app.mesh("root/workers")
            before = list((await workers.whoami()).values())
            assert [w["host"] for w in before] == addresses
            assert (await workers.echo(7)).values() == [7, 7, 7]
            # The secret is on no command line, on either side, and in no remote environment.
            assert _processes_showing(SECRET, "cmdline") == []
            for i in range(3):
                for pid in _in_netns(servers, i, "otpmesh._"):
                    assert SECRET.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
            lost = hosts.live[1]
            since = len(app.events)
            assert "2222" in servers.drop(1)  # host 1's ssh connection is torn down
            with trio.fail_after(60):  # hang guards, here and below
                while lost.alive:
                    await trio.sleep(0.05)
            with trio.fail_after(60):
                while not any(
                    e.kind == LogKind.CHILD_STARTED and e.child_path == "root/workers/1"
                    for e in list(app.events)[since:]
                ):
                    await trio.sleep(0.05)
            after = list((await workers.whoami()).values())
            assert after[1]["host"] != addresses[1]  # restarted on a live host
            assert [after[0]["pid"], after[2]["pid"]] == [before[0]["pid"], before[2]["pid"]]
            exits = [
                e
                for e in list(app.events)[since:]
                if e.kind == LogKind.CHILD_EXITED and e.child_path == "root/workers/1"
            ]
            assert exits and addresses[1] in otpmesh.describe(exits[0].reason)
            # Without its session, the dropped host's agent and worker are gone.
            with trio.fail_after(60):
                while _in_netns(servers, 1, "otpmesh._"):
                    await trio.sleep(0.1)
            print(f"dropped connection: host declared dead: {lost.dead_reason}")
        for i in range(3):  # and on the way out, every agent and worker exited
            with trio.fail_after(30):
                while _in_netns(servers, i, "otpmesh._"):
                    await trio.sleep(0.1)

    run_trio(main, timeout=150)
