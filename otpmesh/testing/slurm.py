"""A real Slurm cluster on one machine, for tests and benchmarks of ``launchers.Slurm``.

munged, slurmctld and one slurmd per node, each node a network namespace (``testing.netns``)
with its own hostname (a UTS namespace), all on a private bridge; everything lives in one
temporary directory (its own munge socket and key, its own ``slurm.conf``), so nothing of the
machine's own Slurm or munge is touched. Needs root, iproute2, and Debian's ``slurm-wlm`` and
``munge`` (``bash .ci/dev slurm`` installs them); ``unavailable()`` says why when it cannot.

    cluster = slurm.start(4)                  # nodes n0..n3 at 10.232.0.10-13, slurmctld at .1
    try:
        job = cluster.sbatch(script, "--nodes=3", "--no-kill")
        ...
        cluster.scancel(job)
    finally:
        cluster.stop()                         # daemons, every process on a node, namespaces

What running slurmd in a namespace takes (found on these machines): ``ip netns exec`` remounts
``/sys`` in a new mount namespace, where slurmd finds no cgroup hierarchy and exits, so a node is
entered with ``nsenter --net`` alone, plus ``unshare --uts`` for its hostname.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from . import netns

SUBNET = "10.232.0"
#: Seconds a slurmctld waits for a silent slurmd before it sets the node DOWN.
SLURMD_TIMEOUT = 6
#: Seconds between SIGTERM and SIGKILL when a job ends (scancel, time limit): its grace.
KILL_WAIT = 10
#: Seconds a preempted job keeps after its SIGTERM.
GRACE_TIME = 10

_DAEMONS = {
    "slurmctld": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
    "munged": "/usr/sbin/munged",
    "sbatch": "/usr/bin/sbatch",
}


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be started here, or None."""
    why = netns.unavailable()
    if why is not None:
        return why
    missing = [name for name, path in _DAEMONS.items() if not os.access(path, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
    for tool in ("nsenter", "unshare", "setpriv"):
        if shutil.which(tool) is None:
            return f"util-linux's {tool} is missing"
    return None


@dataclass
class SlurmCluster:
    """A running cluster: its nodes, its files, and the commands to drive it."""

    dir: Path
    hosts: netns.NetnsHosts
    nodes: list[str]
    conf: Path
    slurmds: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` pointing at this cluster."""
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def ip(self, i: int) -> str:
        return self.hosts.ip(i)

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm client command (``squeue``, ``scontrol``, ...) against this cluster."""
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return done.stdout

    def sbatch(self, script: str | Path, *options: str) -> int:
        """Submit `script`; its output goes to ``dir/job-<id>.out``. Returns the job id."""
        out = str(self.dir / "job-%j.out")
        got = self.run("sbatch", "--parsable", f"--output={out}", *options, str(script))
        return int(got.strip().split(";")[0])

    def output(self, job: int) -> str:
        path = self.dir / f"job-{job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def state(self, job: int) -> str:
        """The job's state (``PENDING``, ``RUNNING``, ``COMPLETED``, ...); "" once forgotten."""
        got = self.run("scontrol", "-o", "show", "job", str(job), check=False)
        match = re.search(r"\bJobState=(\S+)", got)
        return match.group(1) if match else ""

    def scancel(self, job: int, *options: str) -> None:
        self.run("scancel", *options, str(job))

    def node_state(self, i: int) -> str:
        got = self.run("scontrol", "-o", "show", "node", self.nodes[i])
        match = re.search(r"\bState=(\S+)", got)
        return match.group(1) if match else ""

    def node_pids(self, i: int) -> list[int]:
        """Every process in node `i`'s network namespace (its slurmd, steps, tasks)."""
        want = os.stat(self.hosts.net(i)).st_ino
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}/ns/net").st_ino == want:
                        pids.append(int(entry))
                except OSError:
                    continue
        return pids

    def job_pids(self, i: int) -> list[int]:
        """The processes on node `i` other than its slurmd: what jobs left there."""
        slurmd = self.slurmds.get(i)
        return [p for p in self.node_pids(i) if slurmd is None or p != slurmd.pid]

    def kill_slurmd(self, i: int) -> None:
        """SIGKILL node `i`'s slurmd (its running steps carry on, as on a real node)."""
        proc = self.slurmds.pop(i)
        proc.kill()
        proc.wait()

    def kill_node(self, i: int) -> None:
        """Node `i` dies: its slurmd and every process on it are SIGKILLed."""
        if i in self.slurmds:
            self.kill_slurmd(i)
        _kill_all(partial(self.node_pids, i))

    def start_slurmd(self, i: int) -> None:
        """(Re)start node `i`'s slurmd; with ``ReturnToService=2`` a DOWN node comes back."""
        name = self.nodes[i]
        argv = ["/usr/sbin/slurmd", "-D", "-N", name, "-f", str(self.conf)]
        self.slurmds[i] = _daemon(self, f"d-{name}", _named(name, argv, self.hosts.net(i)))

    def reset(self, timeout: float = 60.0) -> None:
        """Back to every node idle (between tests): dead slurmds restarted, jobs cancelled,
        what they left killed, DOWN nodes resumed."""
        for i in range(len(self.nodes)):
            if i not in self.slurmds or self.slurmds[i].poll() is not None:
                self.start_slurmd(i)
        for job in self.run("squeue", "-h", "-o", "%i").split():
            self.scancel(int(job))
        deadline = time.monotonic() + timeout
        while self.run("squeue", "-h", "-o", "%i").split() and time.monotonic() < deadline:
            time.sleep(0.2)
        for i, name in enumerate(self.nodes):
            _kill_all(partial(self.job_pids, i))
            if re.search("DOWN|DRAIN", self.node_state(i)):
                self.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)
        self.wait_idle(timeout)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until every node is up and idle (after a start, or a job ended)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.run("sinfo", "-h", "-N", "-o", "%N %t")
            states = dict(line.split() for line in got.splitlines())
            if all(states.get(n) == "idle" for n in self.nodes):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm nodes not idle after {timeout:g} s: {states}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop every daemon, kill whatever jobs left on the nodes, remove the namespaces."""
        try:
            for i in list(self.slurmds):
                self.kill_slurmd(i)
            for i in range(len(self.nodes)):
                _kill_all(partial(self.node_pids, i))
            netns.terminate(self.daemons)
        finally:
            self.hosts.remove()
            shutil.rmtree(self.dir, ignore_errors=True)


def _kill_all(pids: Callable[[], list[int]]) -> None:
    """SIGKILL the processes `pids()` names until none is left (forks included)."""
    deadline = time.monotonic() + 30
    while (left := pids()) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port


def _conf(cluster: SlurmCluster, ctl_port: int, munge_socket: Path) -> str:
    d = cluster.dir
    nodes = "\n".join(
        f"NodeName={name} NodeAddr={cluster.ip(i)} CPUs=1 RealMemory=1000 State=UNKNOWN"
        for i, name in enumerate(cluster.nodes)
    )
    names = ",".join(cluster.nodes)
    return f"""\
ClusterName=otpmesh
SlurmctldHost=ctl({cluster.hosts.controller_ip})
SlurmctldPort={ctl_port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/ctld.pid
SlurmdPidFile={d}/d-%n.pid
SlurmctldLogFile={d}/ctld.log
SlurmdLogFile={d}/d-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT}
KillWait={KILL_WAIT}
MinJobAge=300
SchedulerParameters=sched_interval=1
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
{nodes}
PartitionName=batch Nodes={names} Default=YES State=UP PriorityTier=1 GraceTime={GRACE_TIME}
PartitionName=urgent Nodes={names} State=UP PriorityTier=2 PreemptMode=OFF
"""


def start(n: int, *, timeout: float = 60.0) -> SlurmCluster:
    """A cluster of `n` nodes named ``n0``..: started, all idle; call ``stop()`` when done."""
    why = unavailable()
    if why is not None:
        raise RuntimeError(f"cannot start a Slurm cluster here: {why}")
    hosts = netns.make_hosts(n, subnet=SUBNET, kind="s")
    root = Path(tempfile.mkdtemp(prefix="otpmesh-slurm-"))
    root.chmod(0o755)  # munged (as munge) must reach its files below
    cluster = SlurmCluster(
        dir=root, hosts=hosts, nodes=[f"n{i}" for i in range(n)], conf=root / "slurm.conf"
    )
    try:
        munge_socket = _start_munge(cluster)
        cluster.conf.write_text(_conf(cluster, _free_port(), munge_socket))
        (root / "state").mkdir()
        ctld = ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(cluster.conf)]
        cluster.daemons.append(_daemon(cluster, "ctld", _named("ctl", ctld)))
        for i, name in enumerate(cluster.nodes):
            (root / f"spool-{name}").mkdir()
            cluster.start_slurmd(i)
        cluster.wait_idle(timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _named(hostname: str, argv: list[str], net: str | None = None) -> list[str]:
    """`argv` run with its own hostname (a UTS namespace), in network namespace `net` if given."""
    enter = ["nsenter", f"--net={net}"] if net else []
    return [*enter, "unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "-", *argv]


def _daemon(cluster: SlurmCluster, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    with open(cluster.dir / f"{name}.stdout", "wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=cluster.env)


def _start_munge(cluster: SlurmCluster) -> Path:
    """A munged of this cluster's own (its key, its socket), run as ``munge``; its socket."""
    d = cluster.dir / "munge"
    d.mkdir()
    d.chmod(0o755)  # munged insists that everyone may reach its socket
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    shutil.chown(d, "munge", "munge")
    shutil.chown(key, "munge", "munge")
    sock = d / "munge.socket"
    as_munge = ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups"]
    files = [f"--key-file={key}", f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log"]
    munged = ["/usr/sbin/munged", "--foreground", f"--socket={sock}", *files]
    proc = _daemon(cluster, "munged", [*as_munge, *munged, f"--seed-file={d}/munged.seed"])
    cluster.daemons.append(proc)
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            log = (cluster.dir / "munged.stdout").read_text(errors="replace")
            raise RuntimeError(f"munged did not start: {log.strip()}")
        time.sleep(0.05)
    return sock
