"""Real ssh logins to hosts on one machine, for tests of ``launchers.SSH``: one sshd per network
namespace host (``testing.netns``), key-based login only, everything in a temporary directory
(host key, client key, ``authorized_keys``, ``sshd_config``, logs), nothing of the machine's own
ssh setup touched. Needs root, iproute2 and openssh-server (``bash .ci/dev slurm`` installs it);
``unavailable()`` says why when it cannot.

    servers = sshd.start(3)                    # hosts at 10.233.0.10-12, sshd on port 2222 each
    try:
        launcher = launchers.SSH(servers.addresses(), ssh=servers.ssh_command(), agent=...)
        async with otpmesh.cluster(launcher, listen=servers.hosts.controller_ip):
            ...
            servers.drop(1)                    # host 1's ssh connection is torn down
    finally:
        servers.stop()
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import netns

SUBNET = "10.233.0"
PORT = 2222


def unavailable() -> str | None:
    """Why sshd hosts cannot be made here, or None."""
    why = netns.unavailable()
    if why is not None:
        return why
    for tool in ("/usr/sbin/sshd", "ssh", "ssh-keygen", "ss"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install openssh-server openssh-client)"
    return None


@dataclass
class SshHosts:
    """Running sshds, one per namespaced host, and the client command that logs in to them."""

    dir: Path
    hosts: netns.NetnsHosts
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def addresses(self) -> list[str]:
        return self.hosts.listen()

    def ssh_command(self) -> tuple[str, ...]:
        """``ssh`` with this set's key, port and an empty known-hosts file (the host keys are
        fresh each run)."""
        return (
            "ssh",
            "-i",
            str(self.dir / "id_ed25519"),
            "-p",
            str(PORT),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            f"UserKnownHostsFile={self.dir / 'known_hosts'}",
            "-o",
            "LogLevel=ERROR",
        )

    def drop(self, i: int) -> str:
        """Tear down host `i`'s ssh connections, as a network failure or a reboot would: the
        TCP sockets of its sshd's sessions are destroyed (``ss -K``). Returns what was closed."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.hosts.names[i], "ss", "-K", "-t", "sport", f"= :{PORT}"],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    def stop(self) -> None:
        try:
            netns.terminate(self.daemons)  # sshd's own sessions end with it
        finally:
            self.hosts.remove()
            shutil.rmtree(self.dir, ignore_errors=True)


def _config(d: Path, listen: str) -> str:
    return f"""\
ListenAddress {listen}
Port {PORT}
HostKey {d}/host_ed25519
PidFile {d}/sshd-{listen}.pid
AuthorizedKeysFile {d}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
"""


def start(n: int, *, timeout: float = 30.0) -> SshHosts:
    """`n` namespaced hosts, each with an sshd that accepts this set's key; ``stop()`` after."""
    why = unavailable()
    if why is not None:
        raise RuntimeError(f"cannot start sshd hosts here: {why}")
    hosts = netns.make_hosts(n, subnet=SUBNET, kind="x")
    servers = SshHosts(dir=Path(tempfile.mkdtemp(prefix="otpmesh-sshd-")), hosts=hosts)
    d = servers.dir
    try:
        for key in ("host_ed25519", "id_ed25519"):
            keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)]
            subprocess.run(keygen, check=True, capture_output=True)
        shutil.copy(d / "id_ed25519.pub", d / "authorized_keys")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        for i, name in enumerate(hosts.names):
            conf = d / f"sshd_config.{i}"
            conf.write_text(_config(d, hosts.ip(i)))
            sshd = ["/usr/sbin/sshd", "-D", "-e", "-f", str(conf)]
            with open(d / f"sshd.{i}.log", "wb") as log:
                servers.daemons.append(
                    subprocess.Popen(
                        ["ip", "netns", "exec", name, *sshd], stdout=log, stderr=subprocess.STDOUT
                    )
                )
        for i in range(n):
            _wait_for_login(servers, i, timeout)
    except BaseException:
        servers.stop()
        raise
    return servers


def _wait_for_login(servers: SshHosts, i: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        probe = subprocess.run(
            [*servers.ssh_command(), servers.hosts.ip(i), "true"], capture_output=True, text=True
        )
        if probe.returncode == 0:
            return
        if servers.daemons[i].poll() is not None or time.monotonic() > deadline:
            log = (servers.dir / f"sshd.{i}.log").read_text(errors="replace")
            raise RuntimeError(f"no ssh login to host {i}: {probe.stderr.strip()}\n{log}")
        time.sleep(0.1)
