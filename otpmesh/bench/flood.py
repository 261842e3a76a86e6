"""Floods: ``python -m otpmesh.bench flood`` prints one JSON array.

An app (a controller and a Mesh of 2 workers, under a lowered descriptor limit) is flooded on
every port it has open (its node sockets and its tcp tensor backend ports, after a 2 MiB value
went both ways with ``OTPMESH_RDMA_BACKENDS=tcp``: over shared memory nothing listens on TCP)
with idle connections, half-sent handshakes and half-sent requests, by a process of the same
user without the app's secret and (``--user``, as root) by another Unix user.
For each flood it reports the medians of the controller's descriptor count and of a unicast
call's round trip before, during and after the flood, and whether a SIGKILLed worker's actor
answered again during it. Timings on shared machines are noisy; compare within one run.

``python -m otpmesh.bench flood --app NOFILE`` runs only the app, driven by lines on stdin
(``ping N``, ``kill``, ``quit``) and answering JSON lines on stdout: tests/test_flood.py uses it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import trio

import otpmesh

from .actor import BenchActor

#: What a flooder runs: the standard library only (another user may have no otpmesh), so that
#: ``python3 -c FLOODER TARGETS PROCS PER`` floods each target ("u:HEX" an abstract Unix
#: address, "t:HOST:PORT" a TCP port) from PROCS processes holding PER connections each,
#: reopening each as soon as the app closes it, until killed (its process group) or its parent
#: is gone. It writes one byte to stdout per TCP connection it opened (another user's Unix ones
#: are refused at once).
FLOODER = r"""
import os, select, socket, sys
targets = sys.argv[1].split(",")
procs, per = int(sys.argv[2]), int(sys.argv[3])
HANDSHAKE = b"OTPMESH\x00\x00\x01\x00\x00"

def open_one(target, kind):
    unix = target.startswith("u:")
    if unix:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address = bytes.fromhex(target[2:]).decode()
    else:
        host, port = target[2:].rsplit(":", 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address = (host, int(port))
    s.settimeout(0.5)
    try:
        s.connect(address)
        if not unix:
            os.write(1, b".")
        if kind == 1:  # half a handshake / the first byte of a request's length
            s.sendall(HANDSHAKE[:6] if unix else b"\x00")
        elif kind == 2:  # a whole handshake, then silence / half a request
            s.sendall(HANDSHAKE if unix else b"\x00\x00\x00\x40\x85\xa6")
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    return s

for _ in range(procs - 1):
    if os.fork() == 0:
        break
parent = os.getppid()  # when it goes (a killed test, a killed flooder), so does this process
held = {}
while os.getppid() == parent:
    for target in targets:
        for kind in range(3):
            for slot in range(per // 3):
                key = (target, kind, slot)
                if key not in held:
                    s = open_one(target, kind)
                    if s is not None:
                        held[key] = s
    ready, _, _ = select.select(list(held.values()), [], [], 0.2)
    for key, s in list(held.items()):
        if s in ready:
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:
                s.close()
                del held[key]
"""


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process `pid` listens on (IPv4), from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    with open(f"/proc/{pid}/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


async def _app(nofile: int) -> None:
    """The flooded app: reports its ports, then answers commands on stdin (module docstring)."""
    from otpmesh._runtime._controller_runtime import runtime

    tree = otpmesh.Supervisor(
        "flood", children=[otpmesh.Mesh("m", BenchActor, shape={"procs": 2}, intensity=3)]
    )
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(nofile, hard), hard))  # workers inherit it
    async with otpmesh.start(tree) as app:
        mesh = app.mesh("flood/m")
        rt = await runtime()
        big = b"\x01" * (2 << 20)  # through the tensor channel both ways: tcp listeners open
        if await mesh[0].echo(big) != big or await mesh[1].echo(big) != big:
            raise RuntimeError("a 2 MiB value came back changed")

        def status() -> dict[str, Any]:
            workers = [p for p in rt.procs.values() if p.alive]
            pids = [os.getpid()] + [p.pid for p in workers]
            return {
                "unix": [rt.node.addr] + [p.addr for p in workers],
                "tcp": sorted({port for pid in pids for port in listening_ports(pid)}),
                "pids": pids,
                "fds": fd_count(os.getpid()),
            }

        def say(msg: dict[str, Any]) -> None:
            print(json.dumps(msg), flush=True)

        say(status())
        lines = trio.wrap_file(sys.stdin)
        while True:
            line = (await lines.readline()).split()
            if not line or line[0] == "quit":
                return
            if line[0] == "ping":
                times = []
                for _ in range(int(line[1])):
                    start = time.perf_counter()
                    await mesh[1].ident()
                    times.append(time.perf_counter() - start)
                say(dict(status(), p50_us=round(statistics.median(times) * 1e6, 1)))
            elif line[0] == "kill":
                before = (await mesh[0].ident())[0]
                os.kill(before, signal.SIGKILL)
                with trio.fail_after(float(line[1]) if len(line) > 1 else 60.0):
                    while True:
                        try:
                            after = (await mesh[0].ident())[0]
                        except otpmesh.ActorDiedError:
                            await trio.sleep(0.05)
                            continue
                        if after != before:
                            break
                say(dict(status(), restarted=after))


#: Seconds the app has to answer a command (a restart included) before it counts as stuck.
ANSWER_TIMEOUT = 90.0


class FloodedApp:
    """The app of ``--app`` in a subprocess, driven line by line (tests and the benchmark)."""

    def __init__(self, nofile: int = 256, backends: str | None = "tcp") -> None:
        env = {k: v for k, v in os.environ.items() if k != "OTPMESH_PRELOAD"}
        # On one host values travel by shared memory and no tcp backend listens; a flood
        # wants its ports open, so by default this app's values travel by tcp.
        if backends is not None:
            env["OTPMESH_RDMA_BACKENDS"] = backends
        self.process = subprocess.Popen(
            [sys.executable, "-m", "otpmesh.bench.flood", "--app", str(nofile)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.status = self._answer()

    def _answer(self, timeout: float = ANSWER_TIMEOUT) -> dict[str, Any]:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:  # alive but stuck (a runtime that failed without exiting): end it
            self.process.kill()
            raise RuntimeError(f"the flooded app did not answer within {timeout:g} s")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the flooded app ended (exit status {self.process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError("the flooded app ended") from None
        self.status = self._answer()
        return self.status

    def targets(self) -> str:
        """The flooder's target list: every node socket and tcp backend port of the app."""
        unix = [f"u:{addr.encode().hex()}" for addr in self.status["unix"]]
        return ",".join(unix + [f"t:127.0.0.1:{port}" for port in self.status["tcp"]])

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.ask("quit")
            except RuntimeError:
                pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Flooder:
    """FLOODER in its own process group, as `user` (None: this process's user)."""

    def __init__(self, targets: str, procs: int, per: int, user: str | None = None) -> None:
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        self.process = subprocess.Popen(
            [python, "-c", FLOODER, targets, str(procs), str(per)],
            user=user,
            cwd="/",
            start_new_session=True,
            stdout=subprocess.PIPE,
        )
        self._opened = 0
        self._counted = threading.Condition()
        threading.Thread(target=self._count, daemon=True).start()

    def _count(self) -> None:
        assert self.process.stdout is not None
        while chunk := os.read(self.process.stdout.fileno(), 1 << 16):
            with self._counted:
                self._opened += len(chunk)
                self._counted.notify_all()

    def wait_opened(self, n: int, timeout: float = 60.0) -> int:
        """Wait until the flood opened `n` TCP connections (or `timeout` passed); how many it
        did."""
        with self._counted:
            self._counted.wait_for(lambda: self._opened >= n, timeout)
            return self._opened

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def settle(app: FloodedApp, baseline: int, deadline: float = 60.0) -> dict[str, Any]:
    """Ping `app` until its controller holds no more descriptors than `baseline`, or until
    `deadline` seconds passed; the last status."""
    give_up = time.monotonic() + deadline
    status = app.ask("ping 20")
    while status["fds"] > baseline and time.monotonic() < give_up:
        time.sleep(0.5)
        status = app.ask("ping 20")
    return status


def measure(user: str | None, procs: int, per: int, calls: int) -> dict[str, Any]:
    """One flood by `user`: fds and unicast p50 before, during and after, and a restart."""
    app = FloodedApp()
    try:
        before = app.ask(f"ping {calls}")
        flooder = Flooder(app.targets(), procs, per, user)
        try:
            flooder.wait_opened(3000)  # it filled every slot it could, many times over
            during = app.ask(f"ping {calls}")
            restart_started = time.monotonic()
            restarted = app.ask("kill 60")
            restart_s = time.monotonic() - restart_started
            during_after_kill = app.ask(f"ping {calls}")
        finally:
            flooder.stop()
        settled = settle(app, before["fds"])
        after = app.ask(f"ping {calls}")
        return {
            "flooder": user or "same user, no secret",
            "flooder_procs": procs,
            "connections_per_proc_per_target": per,
            "targets": len(app.targets().split(",")),
            "fds_before": before["fds"],
            "fds_during": max(during["fds"], during_after_kill["fds"]),
            "fds_after": settled["fds"],
            "p50_us_before": before["p50_us"],
            "p50_us_during": during["p50_us"],
            "p50_us_after": after["p50_us"],
            "restart_during_flood_s": round(restart_s, 2),
            "restarted_pid": restarted["restarted"],
        }
    finally:
        app.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench flood", description=__doc__)
    parser.add_argument("--app", type=int, metavar="NOFILE", help=argparse.SUPPRESS)
    parser.add_argument("--user", help="also flood as this Unix user (needs root)")
    parser.add_argument("--procs", type=int, default=12, help="flooder processes (12)")
    parser.add_argument("--per", type=int, default=30, help="connections each, per target (30)")
    parser.add_argument("--calls", type=int, default=300, help="unicast calls per median (300)")
    args = parser.parse_args(argv)
    if args.app:
        otpmesh.run(_app, args.app)
        return
    rows = [measure(None, args.procs, args.per, args.calls)]
    if args.user:
        rows.append(measure(args.user, args.procs, args.per, args.calls))
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
