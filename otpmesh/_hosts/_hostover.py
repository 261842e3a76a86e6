"""A takeover across hosts: ``Takeover(dir=..., hosts=otpmesh.TakeoverHosts(launcher, ...))``.

The controller layer (_controller/_takeover.py) drives the takeover; this module is its hosts
part: the active controller's host agents, and how a standby gets them back.

How agents find the standby: each agent is started with the list of every controller's
address (``otpmesh agent --controller tcp:A:PORT,tcp:B:PORT``); a controller listens on its
own entry. An agent whose controller is lost keeps its workers for the grace period and dials
the list in turn, saying what it still runs (_agentgrace.py).

The lease across hosts: the ``flock`` in the state directory cannot see a partition (the cut
off controller still holds it, or its host holds it for it), so a standby also takes over when
a majority of the run's hosts have come to it, each having lost the active controller. And the
active controller holds its place only while it reaches a majority of its hosts: cut off from
a majority for AGENT_TIMEOUT, it gives up (the process exits with GIVE_UP_STATUS, touching no
actor: they may be the standby's by now). Safety does not rest on these timings: an agent
serves one epoch at a time and only a higher one next, and fences its workers when it does,
and a worker takes only a higher epoch, so no two controllers drive one actor.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .._core._errors import ActorDiedError, ActorError, OtpmeshError
from .._runtime._adoption import adopted_actors
from .._runtime._controller_runtime import Runtime
from .._runtime._proc import Proc
from .._runtime._statedir import EPOCH
from .._wire._secret import load_secret
from ._cluster import HOST_TIMEOUT, REGISTER_TIMEOUT, Cluster
from ._host import Host
from ._launcher import Launcher

if TYPE_CHECKING:
    from .._runtime._statedir import TakeoverState

log = logging.getLogger("otpmesh.takeover")

#: The exit status of a controller that gave up its place (cut off from most of its hosts).
GIVE_UP_STATUS = 75
#: Cut off from a majority of its hosts this long, an active controller gives up: the agents'
#: own timeout (they look for a standby from then on).
QUORUM_TIMEOUT = 0.75 * HOST_TIMEOUT
ADOPT_TIMEOUT = 5.0


@dataclass(eq=False)
class TakeoverHosts:
    """The hosts of a tree run with a takeover: `launcher` starts their agents on a fresh run
    (a standby finds them instead: they dial it). This controller listens on `listen`:`port`,
    which must be its entry in the agents' ``--controller`` list (give every controller a
    fixed port); `advertise` is the address agents dial when `listen` is a wildcard."""

    launcher: Launcher
    listen: str = "127.0.0.1"
    port: int = 0
    advertise: str | None = None
    timeout: float = REGISTER_TIMEOUT

    def __post_init__(self) -> None:
        self._cluster: Cluster | None = None
        # A standby's: the agents' tokens its active controller journalled, by rank.
        self._expected: dict[int, tuple[bytes, bytes | None]] = {}

    def expect_tokens(self, tokens: dict[int, tuple[bytes, bytes | None]]) -> None:
        """A standby's: the agents' registration tokens the journal holds (the active
        controller's, by rank); only their holders register with it. Nothing when this
        launcher gives agents no tokens (``Static``: the secret alone, as on a fresh run)."""
        self._expected = dict(tokens)
        if self._cluster is not None and self._gives_tokens():
            self._cluster.expect_tokens(self._expected)

    def _gives_tokens(self) -> bool:
        return getattr(self.launcher, "agent_tokens", None) is not None

    # ------------------------------------------------------------ the controller layer's side

    async def attach(self, rt: Runtime) -> None:
        """Listen for agents (a standby does so while it waits: its witnesses come here)."""
        if self._cluster is not None:
            return
        if rt.cluster is not None:
            raise OtpmeshError("a cluster is already attached to this controller")
        rt.node.tcp_secret = load_secret(create=True)
        bound = await rt.node.listen_tcp(self.listen, self.port)
        advertise = self.advertise
        if advertise is None and self.listen in ("0.0.0.0", "::"):
            advertise = socket.gethostname()
        hosts = Cluster(rt)
        hosts.address = (
            bound if advertise is None else f"tcp:{advertise}:{bound.rpartition(':')[2]}"
        )
        hosts.launcher = self.launcher
        hosts.takeover = _HostsLease(hosts)
        if self._gives_tokens():  # none journalled yet: nobody registers until some are
            hosts.expect_tokens(self._expected)
        rt.cluster = self._cluster = hosts
        assert rt.nursery is not None
        rt.nursery.start_soon(hosts.watch)

    def witnesses(self) -> set[int]:
        """The hosts (ranks) that came to this standby, each having lost its controller."""
        c = self._cluster
        return {h.rank for h in c.live if h.resumed is not None} if c is not None else set()

    async def start_fresh(self, rt: Runtime, state: TakeoverState) -> None:
        """A fresh run: start the agents, wait for them, tell each the epoch and grace."""
        await self.attach(rt)
        assert self._cluster is not None
        # As otpmesh.cluster does: only the holders of the launcher's one-time tokens register.
        agent_tokens = getattr(self.launcher, "agent_tokens", None)
        if agent_tokens is not None:
            self._cluster.tokens = dict(agent_tokens())
        self._cluster.takeover.activate(state)
        await self.launcher.start(self._cluster.address, rt.node.tcp_secret or b"")
        await self._cluster.wait_for(self.launcher, self.timeout)

    async def adopt(
        self, rt: Runtime, state: TakeoverState, procs: list[dict[str, Any]]
    ) -> dict[str, Proc]:
        """A standby's takeover: serve the agents that came (and those coming, up to the grace
        period) at the new epoch, and adopt the journalled workers `procs` they still run."""
        await self.attach(rt)
        hosts = self._cluster
        assert hosts is not None
        hosts.takeover.activate(state)
        ranks = {int(r["coords"]["hosts"]) for r in procs}
        with trio.move_on_after(state.grace):
            while not ranks <= {h.rank for h in hosts.live if h.resumed is not None}:
                await trio.sleep(0.02)
        live: dict[str, Proc] = {}
        async with trio.open_nursery() as nursery:
            for rec in procs:
                proc = Proc(
                    rank=int(rec["rank"]), coords=dict(rec["coords"]), proc_id=str(rec["proc"])
                )
                proc.pid, proc.addr, proc.token = int(rec["pid"]), str(rec["addr"]), None
                proc.forked.set()
                rt.adopted(proc)
                host = proc.host = hosts.by_rank(int(rec["coords"]["hosts"]))
                if host is None or proc.proc_id not in (host.resumed or {}):
                    rt.mark_exited(proc, "died (or its host did) while no controller was attached")
                    continue
                host.procs[proc.proc_id] = proc
                nursery.start_soon(_adopt_one, rt, state, proc, live)
        return live

    async def close(self) -> None:
        """The tree stopped in order: stop every agent (each kills its workers) and the rest."""
        hosts, self._cluster = self._cluster, None
        if hosts is None:
            return
        with trio.CancelScope(shield=True):
            await hosts.shutdown()
            await self.launcher.stop()
        hosts._rt.cluster = None
        hosts._rt.node.stop_tcp()


async def _adopt_one(rt: Runtime, state: TakeoverState, proc: Proc, live: dict[str, Proc]) -> None:
    """Take one worker on an agent's host over, by TCP (its pipes stay with its agent)."""
    host: Host = proc.host
    try:
        with trio.fail_after(ADOPT_TIMEOUT):
            conn = await rt.node.connect(proc.addr)
            payload = {"epoch": state.epoch, "addr": rt.node.addr, "pid": os.getpid()}
            answer = await rt.node.sys_call(conn, "adopt", payload, proc.proc_id)
            actors = adopted_actors(answer)
    except (OSError, OtpmeshError, ActorError, ActorDiedError, trio.TooSlowError) as exc:
        why = exc.reason if isinstance(exc, ActorDiedError) else str(exc) or type(exc).__name__
        log.warning(
            "takeover: %s on host %s could not be adopted: %s", proc.proc_id, host.name, why
        )
        rt.kill(proc)
        rt.mark_exited(proc, f"could not be taken over: {why}")
        return
    proc.conn = conn
    rt.node.relays[proc.addr] = host.conn
    proc.actors = actors
    for path in proc.actors:
        proc.named(path)
    proc.ready.set()
    live[proc.proc_id] = proc
    state.proc_started(proc)


class _HostsLease:
    """The cluster's takeover rules (see the module docstring): which epoch its agents are
    told, how long a silent host is waited for, and when this controller gives up."""

    def __init__(self, hosts: Cluster) -> None:
        self._hosts = hosts
        self.epoch: int | None = None  # None: a standby not yet active (agents are held)
        self.grace = 0.0
        self._epoch_file: Path | None = None
        self._state: TakeoverState | None = None

    @property
    def active(self) -> bool:
        """Whether this controller drives the app (a standby is not, until it takes over)."""
        return self.epoch is not None

    def activate(self, state: TakeoverState) -> None:
        self.epoch, self.grace = state.epoch, state.grace
        self._epoch_file = state.root / EPOCH
        self._state = state
        hosts = self._hosts
        table = hosts.token_table()
        if table is not None:  # the table this run starts from, for its own standby
            for rank, (token, presented) in table.items():
                state.agent_token(rank, token, presented)
        for host in hosts.live:
            if table is not None:  # it came while this was a standby: a fresh token
                hosts.rotate_token(host.conn, host.rank)
            self.registered(host)

    def token_changed(self, rank: int, next_token: bytes, presented: bytes | None) -> None:
        if self._state is not None:
            self._state.agent_token(rank, next_token, presented)

    def registered(self, host: Host) -> None:
        if self.epoch is not None:
            payload = {"epoch": self.epoch, "grace": self.grace}
            self._hosts._rt.node.sys_cast(host.conn, "takeover", payload)

    def host_timeout(self) -> float:
        """A silent host's workers run on for the grace period, waiting for a standby: its
        actors are restarted elsewhere only once its agent has surely killed them."""
        return HOST_TIMEOUT + self.grace

    def check_quorum(self, now: float) -> None:
        live = self._hosts.live
        if self.epoch is None or not live:
            return
        silent = [h for h in live if h.silent_for(now) > QUORUM_TIMEOUT]
        if 2 * len(silent) < len(live):
            return
        names = ", ".join(h.name for h in silent)
        _say(
            f"this controller (epoch {self.epoch}) is cut off from {len(silent)} of its "
            f"{len(live)} hosts ({names}) for {QUORUM_TIMEOUT:g} s: a standby may take the app "
            "over, so it stops acting now and waits to learn whether one did"
        )
        # It blocks its own event loop: no task of this process runs again, so none can act
        # (a restart, a driver's call) once the partition heals and connections break. Nor
        # does its lifelines' thread beat on: the hosts it still reaches time out as the others.
        if self._hosts.lifelines is not None:
            self._hosts.lifelines.silence()
        deadline = time.monotonic() + self.grace + HOST_TIMEOUT
        while time.monotonic() < deadline:
            newer = self._newer_epoch()
            if newer is not None:
                _say(f"fenced: a controller at epoch {newer} took the app over; this one gives up")
                os._exit(GIVE_UP_STATUS)
            time.sleep(0.1)
        _say(
            f"no word of a standby in {self.grace + HOST_TIMEOUT:g} s, and its hosts' agents "
            "have killed their workers by now: this controller gives up"
        )
        os._exit(GIVE_UP_STATUS)  # no stop, no cleanup: every step of one would act

    def _newer_epoch(self) -> int | None:
        """The epoch in the state directory, if a standby bumped it past ours (a directory on
        storage this host cannot reach now reads as no news: it waits for the partition to
        heal, or for the grace period to end)."""
        try:
            assert self._epoch_file is not None and self.epoch is not None
            text = self._epoch_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() and int(text) > self.epoch else None


def _say(what: str) -> None:
    print(f"otpmesh: {what} (exit status {GIVE_UP_STATUS})", file=sys.stderr, flush=True)
