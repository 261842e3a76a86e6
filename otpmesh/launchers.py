"""Launchers: how ``otpmesh.cluster`` gets one host agent running per host.

Each is a small adapter over a tool people already run; otpmesh schedules nothing itself.

    Local(hosts=2)                 agents as subprocesses of this program (one machine)
    SSH(["gpu1", "gpu2"])          ``ssh HOST otpmesh agent ...`` per host
    Slurm()                        one ``srun`` over the allocation, one agent per node
    Static(hosts=4)                agents started by anything else (Kubernetes, torchrun's
                                   environment); the controller waits for that many

On a host, ``otpmesh agent --controller tcp:HOST:PORT`` runs an agent; ``run_agent(...)`` is the
same as a Python call. An agent gets the controller's address on its command line and the secret
on its stdin (Local, SSH) or in its environment (Slurm); never in argv, where ``ps`` would show
it. An agent whose stdin a launcher holds exits when that stdin closes, so none outlives its
controller.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import trio

log = logging.getLogger("otpmesh.launchers")


class Launcher(Protocol):
    """Starts agents that dial `controller`; ``hosts`` is how many registrations to wait for."""

    @property
    def hosts(self) -> int: ...
    async def start(self, controller: str, secret: bytes) -> None: ...
    async def stop(self) -> None: ...
    def failure(self) -> str | None:
        """Why an agent it started has already exited (before registering), if one has."""


def agent_args(controller: str, *, rank: int | None = None, listen: str | None = None) -> list[str]:
    """The agent's arguments after its command (``otpmesh agent`` or ``python -m ...``)."""
    args = ["--controller", controller, "--secret-stdin"]
    if rank is not None:
        args += ["--rank", str(rank)]
    if listen is not None:
        args += ["--listen", listen]
    return args


class _Processes:
    """Subprocesses whose stdin carries the secret and then holds them alive."""

    def __init__(self) -> None:
        self.procs: list[trio.Process] = []

    async def spawn(self, argv: list[str], secret: bytes, env: dict[str, str] | None) -> None:
        log.info("starting agent: %s", shlex.join(argv))
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.PIPE, env=env, start_new_session=True
        )
        assert proc.stdin is not None
        await proc.stdin.send_all(secret + b"\n")
        self.procs.append(proc)

    def failure(self) -> str | None:
        for proc in self.procs:
            if proc.returncode is not None:
                return f"agent {shlex.join(proc.args)!r} exited with code {proc.returncode}"  # type: ignore[arg-type]
        return None

    async def stop(self, timeout: float = 5.0) -> None:
        for proc in self.procs:
            if proc.stdin is not None:
                await proc.stdin.aclose()  # the agent's lifeline: it stops its workers and exits
        with trio.move_on_after(timeout):
            for proc in self.procs:
                await proc.wait()
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        self.procs.clear()


@dataclass
class Local:
    """`hosts` agents as subprocesses of this program, on this machine.

    `prefixes` wraps each agent's command (e.g. ``["ip", "netns", "exec", "h1"]`` to run it in
    a network namespace) and `listen` gives each agent's worker address; both per host.
    """

    hosts: int = 1
    prefixes: Sequence[Sequence[str]] | None = None
    listen: Sequence[str] | None = None
    python: str = sys.executable
    _procs: _Processes = field(default_factory=_Processes, repr=False)

    async def start(self, controller: str, secret: bytes) -> None:
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        for rank in range(self.hosts):
            prefix = list(self.prefixes[rank]) if self.prefixes else []
            listen = self.listen[rank] if self.listen else None
            argv = [*prefix, self.python, "-m", "otpmesh._hosts._agent"]
            argv += [*agent_args(controller, rank=rank, listen=listen), "--name", f"local{rank}"]
            await self._procs.spawn(argv, secret, env)

    async def stop(self) -> None:
        await self._procs.stop()

    def failure(self) -> str | None:
        return self._procs.failure()

    @property
    def processes(self) -> list[trio.Process]:
        """The agents' processes, by rank (for chaos tests: kill one to kill its host)."""
        return list(self._procs.procs)


@dataclass
class SSH:
    """One agent per host over ``ssh HOST otpmesh agent ...``; the secret goes over ssh's stdin.

    `ssh` is the client command (add ``-i KEY``, ``-o ...`` as needed); `agent` is the agent
    command on the remote hosts (e.g. ``["/opt/venv/bin/otpmesh", "agent"]``).
    """

    host_names: Sequence[str]
    ssh: Sequence[str] = ("ssh", "-o", "BatchMode=yes")
    agent: Sequence[str] = ("otpmesh", "agent")
    _procs: _Processes = field(default_factory=_Processes, repr=False)

    @property
    def hosts(self) -> int:
        return len(self.host_names)

    async def start(self, controller: str, secret: bytes) -> None:
        for rank, host in enumerate(self.host_names):
            remote = shlex.join([*self.agent, *agent_args(controller, rank=rank), "--name", host])
            await self._procs.spawn([*self.ssh, host, remote], secret, None)

    async def stop(self) -> None:
        await self._procs.stop()

    def failure(self) -> str | None:
        return self._procs.failure()


@dataclass
class Slurm:
    """One agent per node of the current Slurm allocation, started by one ``srun``.

    The node count comes from ``SLURM_JOB_NUM_NODES`` (or `nodes`); each agent's rank from its
    ``SLURM_NODEID``. The secret travels in srun's environment (``OTPMESH_SECRET``), which Slurm
    propagates to the tasks.
    """

    nodes: int | None = None
    srun: Sequence[str] = ("srun",)
    agent: Sequence[str] = ("otpmesh", "agent")
    _procs: _Processes = field(default_factory=_Processes, repr=False)

    @property
    def hosts(self) -> int:
        if self.nodes is not None:
            return self.nodes
        count = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES")
        if not count:
            raise RuntimeError("Slurm launcher outside an allocation: no SLURM_JOB_NUM_NODES")
        return int(count)

    async def start(self, controller: str, secret: bytes) -> None:
        n = self.hosts
        argv = [*self.srun, f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1"]
        argv += [*self.agent, "--controller", controller, "--rank-from-env", "SLURM_NODEID"]
        env = dict(os.environ, OTPMESH_SECRET=secret.decode())
        await self._procs.spawn(argv, b"", env)

    async def stop(self) -> None:
        await self._procs.stop()

    def failure(self) -> str | None:
        return self._procs.failure()


@dataclass
class Static:
    """Agents started by something else (Kubernetes pods, a torchrun job): wait for `hosts`."""

    hosts: int

    async def start(self, controller: str, secret: bytes) -> None:
        log.info("waiting for %d agents to dial %s", self.hosts, controller)

    async def stop(self) -> None:
        return None

    def failure(self) -> str | None:
        return None


def run_agent(
    controller: str,
    *,
    rank: int | None = None,
    name: str | None = None,
    listen: str | None = None,
    secret: bytes | None = None,
    reconnect: float = 60.0,
) -> None:
    """Run this host's agent in this process until its controller shuts it down (or it gives up
    re-registering after `reconnect` seconds): what ``otpmesh agent`` does.

    `controller` is ``tcp:HOST:PORT`` (or ``HOST:PORT``); `secret` defaults to the one
    ``OTPMESH_SECRET`` / ``OTPMESH_SECRET_FILE`` / ``~/.otpmesh/secret`` holds.
    """
    from ._hosts._agent import Agent
    from ._wire._secret import load_secret

    address = controller if controller.startswith("tcp:") else f"tcp:{controller}"
    agent = Agent(
        address,
        secret if secret is not None else load_secret(),
        listen=listen,
        rank=rank,
        name=name,
        reconnect=reconnect,
    )
    trio.run(agent.run)
