"""Separate hosts on one machine, for tests and benchmarks of multi-host meshes: network
namespaces on a private bridge (10.231.0.0/24 unless told another ``subnet``).

The controller stays in this namespace on the bridge's address; host `i` is namespace
``otpm<id>h<i>`` at 10.231.0.(10+i), its agent and workers run inside it. Cutting a host off is
setting its veth down. Needs root and iproute2; ``unavailable()`` says why when it cannot.
Several sets can exist at once (the Slurm helper makes its own): each gets a `kind` letter in
its names and a subnet of its own.

    hosts = netns.make_hosts(3)
    try:
        launcher = launchers.Local(hosts=3, prefixes=hosts.prefixes(), listen=hosts.listen())
        async with otpmesh.cluster(launcher, listen=netns.CONTROLLER_IP):
            ...
    finally:
        hosts.remove()
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

SUBNET = "10.231.0"
CONTROLLER_IP = f"{SUBNET}.1"


@dataclass
class NetnsHosts:
    tag: str
    names: list[str]
    subnet: str = SUBNET

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


def make_hosts(n: int, *, subnet: str = SUBNET, kind: str = "") -> NetnsHosts:
    """`n` namespaced hosts on a fresh bridge; call ``remove()`` when done.

    `subnet` is the first three octets; `kind` (one letter or none) tells this set's names from
    another's made by the same process."""
    if not re.fullmatch(r"[a-z]?", kind):
        raise ValueError(f"kind must be one lowercase letter or empty, not {kind!r}")
    remove_stale()
    hosts = NetnsHosts(tag=f"{os.getpid()}{kind}", names=[], subnet=subnet)
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
