"""Separate hosts on one machine, for tests and benchmarks of multi-host meshes: network
namespaces on a private bridge.

The controller stays in this namespace on the bridge's address (``hosts.controller_ip``, the
subnet's .1); host `i` is namespace ``otpm<id>h<i>`` at the subnet's .(10+i), its agent and
workers run inside it. Cutting a host off is setting its veth down. Needs root and iproute2;
``unavailable()`` says why when it cannot.

Namespaces and bridges are machine-wide, so every set claims its subnet for as long as it
exists (a lock file under /run/otpmesh-netns that the kernel releases when its process dies):
without a ``subnet`` a set takes the first free one of 10.231.0-255, so that parallel test
workers, or two people's runs on one machine, never put two bridges on one subnet; a set
given a ``subnet`` (the Slurm and sshd helpers each have their own) is refused while another
holds it. Each set also gets a `kind` letter in its names.

    hosts = netns.make_hosts(3)
    try:
        launcher = launchers.Local(hosts=3, prefixes=hosts.prefixes(), listen=hosts.listen())
        async with otpmesh.cluster(launcher, listen=hosts.controller_ip):
            ...
    finally:
        hosts.remove()
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

#: The subnets a set without an explicit ``subnet`` takes the first free one of: 10.231.0-255.
DEFAULT_SUBNETS = tuple(f"10.231.{third}" for third in range(256))

#: Where the claims are: one lock file per subnet, machine-wide like the namespaces themselves.
CLAIMS = "/run/otpmesh-netns"


@dataclass
class NetnsHosts:
    tag: str
    names: list[str]
    subnet: str
    claim: int = field(default=-1, repr=False)  # the locked claim file; closed by remove()

    @property
    def bridge(self) -> str:
        return f"otpm{self.tag}br"

    @property
    def controller_ip(self) -> str:
        """This namespace's address on the bridge."""
        return f"{self.subnet}.1"

    def ip(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def net(self, i: int) -> str:
        """Host `i`'s network namespace file (for ``nsenter --net=...``)."""
        return f"/run/netns/{self.names[i]}"

    def veth(self, i: int) -> str:
        return f"otpm{self.tag}v{i}"

    def prefixes(self) -> list[list[str]]:
        return [["ip", "netns", "exec", name] for name in self.names]

    def listen(self) -> list[str]:
        return [self.ip(i) for i in range(len(self.names))]

    def cut(self, i: int) -> None:
        """Take host `i` off the network (its link goes down; nothing is told)."""
        _ip("link", "set", self.veth(i), "down")

    def reconnect(self, i: int) -> None:
        _ip("link", "set", self.veth(i), "up")

    def remove(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        if self.claim >= 0:  # the subnet is free for the next set only once its bridge is gone
            os.close(self.claim)
            self.claim = -1


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def unavailable() -> str | None:
    """Why namespaced hosts cannot be made here, or None."""
    if os.environ.get("OTPMESH_TEST_NO_NETNS"):
        return "disabled by OTPMESH_TEST_NO_NETNS"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's ip command is missing"
    probe = f"otpmprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def remove_stale() -> None:
    """Remove the namespaces and bridges of earlier runs that were killed before cleaning up
    (their names carry the pid of the process that made them)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for match in re.finditer(r"\botpm(\d+)[a-z]?(h\d+|br)\b", listed + links):
        pid, kind = int(match.group(1)), match.group(2)
        if pid == os.getpid() or os.path.exists(f"/proc/{pid}"):
            continue
        if kind == "br":
            subprocess.run(["ip", "link", "del", match.group(0)], capture_output=True)
        else:
            subprocess.run(["ip", "netns", "del", match.group(0)], capture_output=True)


def _try_claim(subnet: str) -> int | None:
    """The locked claim file of `subnet`, or None while another set (of any process) holds it."""
    os.makedirs(CLAIMS, exist_ok=True)
    fd = os.open(os.path.join(CLAIMS, subnet), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for the error below
    return fd


def _holder(subnet: str) -> str:
    try:
        with open(os.path.join(CLAIMS, subnet)) as f:
            return f"pid {f.read().strip() or '?'}"
    except OSError:
        return "another process"


def _claim(subnet: str | None) -> tuple[str, int]:
    if subnet is not None:
        if not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}", subnet):
            raise ValueError(f"subnet is the first three octets (e.g. '10.232.0'), not {subnet!r}")
        fd = _try_claim(subnet)
        if fd is None:
            raise RuntimeError(
                f"subnet {subnet} is held by another set of namespaced hosts on this machine "
                f"({_holder(subnet)}): wait for it to be removed, or pass another subnet "
                "(without one, make_hosts takes a free one)"
            )
        return subnet, fd
    for candidate in DEFAULT_SUBNETS:
        fd = _try_claim(candidate)
        if fd is not None:
            return candidate, fd
    raise RuntimeError(
        f"all {len(DEFAULT_SUBNETS)} subnets 10.231.0-255 are held by sets of namespaced hosts "
        f"on this machine (claims in {CLAIMS}): remove some, or pass a subnet"
    )


def make_hosts(n: int, *, subnet: str | None = None, kind: str = "") -> NetnsHosts:
    """`n` namespaced hosts on a fresh bridge; call ``remove()`` when done.

    `subnet` is the first three octets (default: the first free one of 10.231.0-255, claimed
    machine-wide until ``remove()``); `kind` (one letter or none) tells this set's names from
    another's made by the same process."""
    if not re.fullmatch(r"[a-z]?", kind):
        raise ValueError(f"kind must be one lowercase letter or empty, not {kind!r}")
    remove_stale()
    claimed, claim = _claim(subnet)
    hosts = NetnsHosts(tag=f"{os.getpid()}{kind}", names=[], subnet=claimed, claim=claim)
    try:
        _ip("link", "add", hosts.bridge, "type", "bridge")
        _ip("addr", "add", f"{hosts.controller_ip}/24", "dev", hosts.bridge)
        _ip("link", "set", hosts.bridge, "up")
        for i in range(n):
            name = f"otpm{hosts.tag}h{i}"
            _ip("netns", "add", name)
            hosts.names.append(name)
            _ip("link", "add", hosts.veth(i), "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", hosts.veth(i), "master", hosts.bridge, "up")
            _ip("-n", name, "addr", "add", f"{hosts.ip(i)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
    except BaseException:
        hosts.remove()
        raise
    return hosts


def terminate(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop daemons started in the hosts, last started first: SIGTERM, then SIGKILL after 10 s."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
