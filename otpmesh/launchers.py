"""Launchers: how ``otpmesh.cluster`` gets one host agent running per host.

Each is a small adapter over a tool people already run; otpmesh schedules nothing itself.

    Local(hosts=2)                 agents as subprocesses of this program (one machine)
    SSH(["gpu1", "gpu2"])          ``ssh HOST otpmesh agent ...`` per host
    Slurm()                        one ``srun`` step per node of the allocation, one agent each
    Static(hosts=4)                agents started by anything else (Kubernetes, torchrun's
                                   environment); the controller waits for that many

On a host, ``otpmesh agent --controller tcp:HOST:PORT`` runs an agent; ``run_agent(...)`` is the
same as a Python call. An agent gets the controller's address on its command line and the secret
on its stdin (Local, SSH, Slurm through srun); never in argv, where ``ps`` would show it. An agent
whose stdin a launcher holds exits when that stdin closes, so none outlives its controller.

The launchers that hold an agent's stdin also give it, after the secret, a one-time registration
token for its rank (``agent_tokens``): only that agent can register as that host, so a process
that merely knows the cluster's secret cannot take a host's place. Static agents have none.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import trio

from ._hosts._launcher import Launcher as Launcher
from ._runtime._run import stops_on_sigterm
from ._wire._owntasks import interrupt

log = logging.getLogger("otpmesh.launchers")


def agent_args(
    controller: str, *, rank: int | None = None, listen: str | None = None, token: bool = False
) -> list[str]:
    """The agent's arguments after its command (``otpmesh agent`` or ``python -m ...``);
    `token`: its stdin carries a registration token after the secret."""
    args = ["--controller", controller, "--secret-stdin"]
    if token:
        args.append("--token-stdin")
    if rank is not None:
        args += ["--rank", str(rank)]
    if listen is not None:
        args += ["--listen", listen]
    return args


class _Processes:
    """Subprocesses whose stdin carries the secret (and a registration token) and then holds
    them alive."""

    def __init__(self, what: str) -> None:
        self.what = what  # what each process is to its host: "agent process", "ssh session"
        self.procs: list[trio.Process] = []
        self.tokens: dict[int, bytes] = {}  # by rank: what the next start gives each agent

    def new_tokens(self, hosts: int) -> dict[int, bytes]:
        # Hex: a line of stdin, whatever the bytes.
        self.tokens = {rank: secrets.token_hex(32).encode() for rank in range(hosts)}
        return dict(self.tokens)

    def agent_args(self, controller: str, rank: int, listen: str | None = None) -> list[str]:
        return agent_args(controller, rank=rank, listen=listen, token=rank in self.tokens)

    async def spawn(
        self, argv: list[str], secret: bytes, env: dict[str, str] | None, rank: int
    ) -> None:
        log.info("starting agent: %s", shlex.join(argv))
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.PIPE, env=env, start_new_session=True
        )
        assert proc.stdin is not None
        token = self.tokens.get(rank)
        await proc.stdin.send_all(secret + b"\n" + (token + b"\n" if token else b""))
        self.procs.append(proc)

    def failure(self) -> str | None:
        for proc in self.procs:
            if proc.returncode is not None:
                return f"agent {shlex.join(proc.args)!r} exited with code {proc.returncode}"  # type: ignore[arg-type]
        return None

    def ended(self) -> dict[int, str]:
        """Read after "which" in a host's reason: "... host n2, which lost its srun step ..."."""
        return {
            rank: f"lost its {self.what} (exit code {proc.returncode})"
            for rank, proc in enumerate(self.procs)
            if proc.returncode is not None
        }

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
    _procs: _Processes = field(default_factory=lambda: _Processes("agent process"), repr=False)

    async def start(self, controller: str, secret: bytes) -> None:
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        for rank in range(self.hosts):
            prefix = list(self.prefixes[rank]) if self.prefixes else []
            listen = self.listen[rank] if self.listen else None
            argv = [*prefix, self.python, "-m", "otpmesh._hosts._agent"]
            argv += [*self._procs.agent_args(controller, rank, listen), "--name", f"local{rank}"]
            await self._procs.spawn(argv, secret, env, rank)

    async def stop(self) -> None:
        await self._procs.stop()

    def agent_tokens(self) -> dict[int, bytes]:
        """Fresh one-time registration tokens, by rank, that the next ``start`` gives its agents
        on stdin; ``otpmesh.cluster`` asks for them first and registers only their holders."""
        return self._procs.new_tokens(self.hosts)

    def failure(self) -> str | None:
        return self._procs.failure()

    def ended(self) -> dict[int, str]:
        return self._procs.ended()

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
    _procs: _Processes = field(default_factory=lambda: _Processes("ssh session"), repr=False)

    @property
    def hosts(self) -> int:
        return len(self.host_names)

    async def start(self, controller: str, secret: bytes) -> None:
        for rank, host in enumerate(self.host_names):
            argv = [*self.agent, *self._procs.agent_args(controller, rank), "--name", host]
            await self._procs.spawn([*self.ssh, host, shlex.join(argv)], secret, None, rank)

    async def stop(self) -> None:
        await self._procs.stop()

    def agent_tokens(self) -> dict[int, bytes]:
        """Fresh one-time registration tokens, by rank, that the next ``start`` gives its agents
        on stdin; ``otpmesh.cluster`` asks for them first and registers only their holders."""
        return self._procs.new_tokens(self.hosts)

    def failure(self) -> str | None:
        return self._procs.failure()

    def ended(self) -> dict[int, str]:
        return self._procs.ended()


@dataclass
class Slurm:
    """One agent per node of the current Slurm allocation, each started by its own ``srun``.

    The node count comes from ``SLURM_JOB_NUM_NODES`` (or `nodes`). Agent `i` runs as a one-task
    step on the allocation's node `i` (``srun --nodes=1 --ntasks=1 --relative=i``), so that when
    one agent dies only its own step ends: a lost node is a lost host, which the supervision
    tree handles, never the whole mesh killed by srun. The secret goes over srun's stdin, which
    srun forwards to its task and whose end is the agent's lifeline.

    When the job ends (``scancel``, the time limit, preemption), Slurm sends SIGTERM to every
    process of the job, then SIGKILL after its grace (``KillWait``, or the partition's
    ``GraceTime``). For that grace the agents and their workers ignore SIGTERM, and this
    program stops in order (``otpmesh.run`` does so on SIGTERM, exit status 143; in a program
    of its own it is taken as Ctrl-C): the tree stops, each actor's ``on_stop`` runs, and only
    then are the agents told to exit. Submit with ``--no-kill`` (``sbatch -k``) so that a
    node that fails ends only its host, not the job.
    """

    nodes: int | None = None
    srun: Sequence[str] = ("srun",)
    agent: Sequence[str] = ("otpmesh", "agent")
    _procs: _Processes = field(default_factory=lambda: _Processes("srun step"), repr=False)
    _sigterm: _Sigterm | None = field(default=None, repr=False)

    @property
    def hosts(self) -> int:
        if self.nodes is not None:
            return self.nodes
        count = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES")
        if not count:
            raise RuntimeError(
                "launchers.Slurm() outside a Slurm allocation: no SLURM_JOB_NUM_NODES; run the "
                "controller inside 'sbatch' or 'salloc', or pass Slurm(nodes=N)"
            )
        return int(count)

    def step_argv(self, controller: str, rank: int) -> list[str]:
        """The ``srun`` command line that starts agent `rank` on the allocation's node `rank`."""
        step = [*self.srun, "--nodes=1", "--ntasks=1", f"--relative={rank}"]
        # A failed agent ends its own step, quietly; --overlap: the agents' steps leave the
        # allocation's CPUs to whatever else the job runs (the workers are the agents' children).
        step += ["--kill-on-bad-exit=0", "--overlap", f"--job-name=otpmesh-agent-{rank}"]
        args = self._procs.agent_args(controller, rank)
        return [*step, *self.agent, *args, "--ignore-sigterm"]

    async def start(self, controller: str, secret: bytes) -> None:
        self._sigterm = _Sigterm.install()
        for rank in range(self.hosts):
            await self._procs.spawn(self.step_argv(controller, rank), secret, None, rank)

    async def stop(self) -> None:
        await self._procs.stop()
        if self._sigterm is not None:
            self._sigterm.uninstall()
            self._sigterm = None

    def agent_tokens(self) -> dict[int, bytes]:
        """Fresh one-time registration tokens, by rank, that the next ``start`` gives its agents
        on stdin; ``otpmesh.cluster`` asks for them first and registers only their holders."""
        return self._procs.new_tokens(self.hosts)

    def failure(self) -> str | None:
        return self._procs.failure()

    def ended(self) -> dict[int, str]:
        return self._procs.ended()


class _Sigterm:
    """SIGTERM taken as SIGINT (Ctrl-C) while a Slurm cluster runs: the end of the job is an
    orderly stop within Slurm's grace, not an instant death that skips every ``on_stop``."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    @classmethod
    def install(cls) -> _Sigterm | None:
        if threading.current_thread() is not threading.main_thread():
            return None  # signals reach only the main thread's handlers
        if stops_on_sigterm():
            return None  # otpmesh.run's own orderly stop is already the handler

        def as_interrupt(signum: int, frame: FrameType | None) -> None:
            handler = signal.getsignal(signal.SIGINT)
            if callable(handler):
                interrupt(handler, frame)  # trio's, as Ctrl-C (_owntasks)
            else:
                raise KeyboardInterrupt

        return cls(signal.signal(signal.SIGTERM, as_interrupt))

    def uninstall(self) -> None:
        signal.signal(signal.SIGTERM, self.previous)


@dataclass
class Static:
    """Agents started by something else (Kubernetes pods, a torchrun job): wait for `hosts`.

    Nothing gives these agents a registration token: any process that knows the cluster's
    secret can register as a further host (never in a live host's place), so keep that secret
    as close as the hosts themselves (docs/security.md).
    """

    hosts: int

    async def start(self, controller: str, secret: bytes) -> None:
        log.info("waiting for %d agents to dial %s", self.hosts, controller)

    async def stop(self) -> None:
        return None

    def failure(self) -> str | None:
        return None

    def ended(self) -> dict[int, str]:
        return {}


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
