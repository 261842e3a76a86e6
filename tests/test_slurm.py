"""launchers.Slurm on a real Slurm cluster: munged, slurmctld and one slurmd per node, each node
a network namespace with its own hostname (``otpmesh.testing.slurm``). Jobs are submitted with
``sbatch``; the controller runs in the batch script on the allocation's first node and starts
the agents with the real ``srun``. No stand-ins.

Slow (a cluster, then a job per test): ``bash .ci/dev slurm`` runs them, installing Slurm and
munge where it can. Each test prints what it measured; nothing here asserts on timing.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otpmesh.testing import slurm

pytestmark = pytest.mark.slow

UNAVAILABLE = slurm.unavailable()
ROOT = Path(__file__).resolve().parent.parent

# The job's controller. Commands come as files in OTPMESH_TEST_DIR; answers are lines on stdout
# (the job's output file): "ready", "who", "moved".
_CONTROLLER = """
import json, os, socket, sys, time
import trio
import otpmesh
from otpmesh import ONE_FOR_ONE, Mesh, Supervisor, launchers
from tests.actors import Echo

DIR = os.environ["OTPMESH_TEST_DIR"]


class Stopper(Echo):
    async def on_stop(self, reason):
        await trio.sleep(float(os.environ.get("OTPMESH_TEST_STOP_DELAY", "0")))
        with open(f"{DIR}/on_stop.{otpmesh.context().rank}", "w") as f:
            f.write(f"{os.environ['OTPMESH_HOST']} {otpmesh.describe(reason)}")


def own_ip():
    # No DNS for the test nodes: advertise the address this node reaches slurmctld's from.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((os.environ["OTPMESH_TEST_CTL_IP"], 9))
        return s.getsockname()[0]


def command():
    for name in sorted(os.listdir(DIR)):
        if name.startswith("cmd."):
            path = f"{DIR}/{name}"
            text = open(path).read()
            os.unlink(path)
            return name[4:], text
    return None, None


async def main():
    hosts = int(os.environ["OTPMESH_TEST_MESH_HOSTS"])
    mesh = Mesh("workers", Stopper, shape={"hosts": hosts, "procs": 1}, strategy=ONE_FOR_ONE,
                intensity=10, shutdown=30.0)
    tree = Supervisor("root", strategy=ONE_FOR_ONE, intensity=10, children=[mesh])
    agent = (sys.executable, "-m", "otpmesh._hosts._agent")
    launcher = launchers.Slurm(agent=agent)
    async with otpmesh.cluster(launcher, listen="0.0.0.0", advertise=own_ip()) as cluster:
        async with otpmesh.start(tree) as app:
            workers = app.mesh("root/workers")
            who = list((await workers.whoami()).values())
            echoed = (await workers.echo("hi")).values()
            print("ready", json.dumps({"t": time.time(), "who": who, "echo": echoed,
                                       "agents": [h.name for h in cluster.live]}), flush=True)
            while True:
                name, text = command()
                if name == "who":
                    print("who", json.dumps(list((await workers.whoami()).values())), flush=True)
                elif name == "moved":  # text: when the test killed rank's host, and the rank
                    since, rank = text.split()
                    while True:
                        try:
                            w = await workers[int(rank)].whoami()
                            if w["host"] != os.environ["OTPMESH_TEST_LOST"]:
                                break
                        except (otpmesh.ActorError, otpmesh.ActorDiedError):
                            await trio.sleep(0.01)  # a call racing the host's loss
                    print("moved", json.dumps({"after": time.time() - float(since), "who": w}),
                          flush=True)
                await trio.sleep(0.05)


if __name__ == "__main__":
    otpmesh.run(main)
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[slurm.SlurmCluster]:
    if UNAVAILABLE is not None:
        pytest.skip(f"no Slurm cluster here: {UNAVAILABLE}")
    started = slurm.start(4)
    try:
        yield started
    finally:
        started.stop()


class Job:
    """One sbatch job running _CONTROLLER, and the files it talks through."""

    def __init__(self, cluster: slurm.SlurmCluster, tmp: Path, nodes: int, **env: str) -> None:
        self.cluster, self.dir = cluster, tmp
        tmp.chmod(0o755)
        script = tmp / "controller.py"
        script.write_text(_CONTROLLER)
        batch = tmp / "job.sh"
        batch.write_text(f"#!/bin/sh\nexec {sys.executable} {script}\n")
        environ = {
            "OTPMESH_TEST_DIR": str(tmp),
            "OTPMESH_TEST_CTL_IP": cluster.hosts.controller_ip,
            "OTPMESH_TEST_MESH_HOSTS": "3",
            "OTPMESH_SECRET": "slurm-test-secret",
            "PYTHONPATH": str(ROOT),
            **env,
        }
        exports = ",".join(f"{k}={v}" for k, v in environ.items())
        self.submitted = time.time()
        # --no-kill: a node that fails ends its host, not the job (docs/multihost.md).
        self.id = cluster.sbatch(batch, f"--nodes={nodes}", "--no-kill", f"--export=ALL,{exports}")
        self.ready = self.wait_for("ready")

    def lines(self, kind: str) -> list[dict[str, Any]]:
        return [
            json.loads(line.split(" ", 1)[1])
            for line in self.cluster.output(self.id).splitlines()
            if line.startswith(kind + " ")
        ]

    def wait_for(self, kind: str, timeout: float = 90.0) -> Any:
        deadline = time.monotonic() + timeout  # a hang guard
        while not (got := self.lines(kind)):
            state = self.cluster.state(self.id)
            if time.monotonic() > deadline or state in ("FAILED", "COMPLETED", "CANCELLED"):
                raise AssertionError(
                    f"no {kind!r} from job {self.id} ({state}):\n{self.cluster.output(self.id)}"
                )
            time.sleep(0.1)
        return got[-1]

    def ask(self, kind: str, text: str = "") -> Any:
        before = len(self.lines(kind))
        (self.dir / f"cmd.{kind}").write_text(text)
        deadline = time.monotonic() + 90
        while len(self.lines(kind)) == before:
            assert time.monotonic() < deadline, self.cluster.output(self.id)
            time.sleep(0.1)
        return self.lines(kind)[-1]

    def wait_ended(self, states: tuple[str, ...]) -> str:
        deadline = time.monotonic() + 90
        while (state := self.cluster.state(self.id)) not in states:
            assert time.monotonic() < deadline, f"job {self.id} still {state}"
            time.sleep(0.2)
        return state

    def on_stop(self) -> dict[int, str]:
        return {
            int(p.name.split(".")[1]): p.read_text() for p in sorted(self.dir.glob("on_stop.*"))
        }


@pytest.fixture
def job_dir(cluster: slurm.SlurmCluster, tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    cluster.reset()  # every node idle again for the next test, whatever this one left


def _no_process_left(cluster: slurm.SlurmCluster, nodes: range) -> None:
    deadline = time.monotonic() + 60  # a hang guard: Slurm's own cleanup takes its time
    while any(cluster.job_pids(i) for i in nodes):
        assert time.monotonic() < deadline, {i: _cmdlines(cluster.job_pids(i)) for i in nodes}
        time.sleep(0.2)


def _cmdlines(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            pass
    return out


def _otpmesh_pids(cluster: slurm.SlurmCluster, node: int) -> list[int]:
    return [
        pid
        for pid, cmd in zip(cluster.job_pids(node), _cmdlines(cluster.job_pids(node)), strict=False)
        if "otpmesh" in cmd
    ]


@pytest.mark.timeout(300)
def test_a_three_node_job_runs_a_supervised_mesh_across_its_nodes(
    cluster: slurm.SlurmCluster, job_dir: Path
) -> None:
    job = Job(cluster, job_dir, nodes=3)
    ready = job.ready
    assert ready["agents"] == ["n0", "n1", "n2"]  # one agent per node, named by Slurm's hostname
    assert [w["host"] for w in ready["who"]] == ["n0", "n1", "n2"]
    assert len({w["netns"] for w in ready["who"]}) == 3  # three separate network stacks
    assert ready["echo"] == ["hi", "hi", "hi"]  # a broadcast, relayed by each node's agent
    # One srun step per node, each one task: a dead agent ends only its own step.
    steps = cluster.run("squeue", "-h", "-s", "-j", str(job.id), "-o", "%i %N")
    assert sorted(line.split()[1] for line in steps.splitlines()) == ["n0", "n0", "n1", "n2"]
    print(f"sbatch to the first reply of a 3-node mesh: {ready['t'] - job.submitted:.2f} s")
    job.ask("who")
    cluster.scancel(job.id)
    assert job.wait_ended(("CANCELLED",)) == "CANCELLED"
    _no_process_left(cluster, range(4))
    # scancel is SIGTERM then, after KillWait, SIGKILL: the tree stopped in order meanwhile.
    stopped = {r: f"n{r} stopped (shutdown)" for r in range(3)}
    assert job.on_stop() == stopped, cluster.output(job.id)  # what the job printed, if not
    assert "otpmesh: terminated (SIGTERM), all actors stopped" in cluster.output(job.id)


@pytest.mark.timeout(300)
def test_preemption_gives_the_tree_its_grace_and_the_actors_their_on_stop(
    cluster: slurm.SlurmCluster, job_dir: Path
) -> None:
    # Each on_stop takes 2 s (saving a checkpoint, say): well inside the partition's GraceTime.
    job = Job(cluster, job_dir, nodes=3, OTPMESH_TEST_STOP_DELAY="2")
    urgent = ["--partition=urgent", "--nodes=1", "--nodelist=n1", "--wrap", "true"]
    urgent_job = int(cluster.run("sbatch", "--parsable", *urgent).split(";")[0])
    assert job.wait_ended(("PREEMPTED",)) == "PREEMPTED"
    stopped = {r: f"n{r} stopped (shutdown)" for r in range(3)}
    assert job.on_stop() == stopped, cluster.output(job.id)  # what the job printed, if not
    assert "otpmesh: terminated (SIGTERM), all actors stopped" in cluster.output(job.id)
    _no_process_left(cluster, range(4))
    cluster.scancel(urgent_job)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["agent killed", "node set DOWN", "slurmd killed"])
def test_a_lost_node_has_its_actors_restarted_on_the_spare(
    cluster: slurm.SlurmCluster, job_dir: Path, how: str
) -> None:
    """4 nodes, a mesh over 3: node n2's actor moves to n3, the others keep running."""
    job = Job(cluster, job_dir, nodes=4, OTPMESH_TEST_LOST="n2")
    before = job.ready["who"]
    assert [w["host"] for w in before] == ["n0", "n1", "n2"]
    killed_at = time.time()
    if how == "agent killed":
        agent = next(
            pid
            for pid, cmd in zip(cluster.job_pids(2), _cmdlines(cluster.job_pids(2)), strict=False)
            if "otpmesh._hosts._agent" in cmd
        )
        os.kill(agent, signal.SIGKILL)
    elif how == "node set DOWN":
        cluster.run("scontrol", "update", "nodename=n2", "state=down", "reason=test")
    else:  # Slurm sets the node DOWN after SlurmdTimeout; its srun step then ends
        cluster.kill_slurmd(2)
    moved = job.ask("moved", f"{killed_at} 2")
    assert moved["who"]["host"] == "n3"
    after = job.ask("who")
    assert [w["host"] for w in after] == ["n0", "n1", "n3"]
    assert [w["pid"] for w in after[:2]] == [w["pid"] for w in before[:2]]  # untouched
    # Nothing of otpmesh is left on the lost node (a slurmstepd whose slurmd is dead may be).
    deadline = time.monotonic() + 60
    while _otpmesh_pids(cluster, 2):
        assert time.monotonic() < deadline, _cmdlines(_otpmesh_pids(cluster, 2))
        time.sleep(0.2)
    print(f"{how}: its actor answered on the spare after {moved['after']:.2f} s")
    cluster.scancel(job.id)
    job.wait_ended(("CANCELLED",))
    _no_process_left(cluster, range(2))
