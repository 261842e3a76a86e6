"""Hosts past this one: the controller's side of the host agents (_agent.py).

``otpmesh.cluster(launcher)`` listens on TCP, has the launcher start one agent per host, waits for
them to register, and attaches the hosts to the runtime: from then on a mesh slot's ``hosts``
coordinate names the host whose agent forks its process (``proc_mesh(hosts=2, gpus=4)``).

Host failure: controller and agents beat every HEARTBEAT_INTERVAL, on the agent's connection and
on its lifeline (_lifeline.py: a thread's, so a held event loop does not stop them). A host whose
agent connection or lifeline closes, which is silent for HOST_TIMEOUT on both, or whose launch
ended (``launcher.ended()``: its srun step or ssh session), is declared dead: every process on it
exits with a reason naming the host, so each actor's supervisor sees a process failure and
restarts it, on the same host index if that host is back, else on the live host with the fewest
workers (a spare), unless ``relocate=False``. A dead host's registration stays refused; its agent
registers afresh.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import trio

from .._core._errors import ActorDiedError, ActorError, SpawnError
from .._runtime._proc import Proc, hello_peer, new_registration_token, token_matches
from .._wire._connection import Connection
from ._agentgrace import resume_refusal
from ._host import Host
from ._launcher import Launcher
from ._lifeline import Lifeline, Lifelines

if TYPE_CHECKING:
    from .._runtime._controller_runtime import Runtime

log = logging.getLogger("otpmesh.cluster")

REGISTER_TIMEOUT = 60.0
#: Controller and agents beat this often; a host silent for HOST_TIMEOUT is declared dead.
HEARTBEAT_INTERVAL = float(os.environ.get("OTPMESH_HOST_HEARTBEAT_INTERVAL", "0.2"))
HOST_TIMEOUT = float(os.environ.get("OTPMESH_HOST_TIMEOUT", "1.0"))
#: Beats survive a held event loop (the lifelines' thread sends them), but calls, replies and
#: restarts wait for it: a loop held this long is logged, with what to do about it.
HELD_WARNING = 0.375 * HOST_TIMEOUT
#: Held this long, the loop is taken for hung for good (a deadlocked driver), not busy: the
#: lifelines stop beating and the agents fence their workers (a standby may take over).
LOOP_HELD_LIMIT = float(os.environ.get("OTPMESH_LOOP_HELD_LIMIT", "60"))


class Cluster:
    """The hosts of one ``otpmesh.cluster`` block, attached to the controller runtime."""

    def __init__(self, rt: Runtime, *, relocate: bool = True) -> None:
        self._rt = rt
        self.relocate = relocate
        self.hosts: list[Host] = []  # every registration, in order, dead ones included
        self._by_rank: dict[int, Host] = {}
        self._registered = trio.Event()
        node = rt.node
        node.sys_inline["beat"] = self._beat
        node.sys_inline["proc_spawned"] = self._proc_spawned
        node.sys_inline["proc_exit"] = self._proc_exit
        node.sys_inline["proc_output"] = self._proc_output
        self.address = ""  # what agents dial: tcp:HOST:PORT
        self.launcher: Launcher | None = None
        # By rank: the one-time token the agent of that rank holds for its next registration
        # (its launcher gave it the first; each registration hands it the next). None: the
        # launcher gives agents no token (Static): any holder of the cluster secret may register.
        self.tokens: dict[int, bytes] | None = None
        # By rank: the token its agent presented last. It stays good until the agent presents
        # the next (the cast carrying that one may be lost with its connection).
        self._presented: dict[int, bytes] = {}
        self.takeover: Any = None  # with a takeover: its rules (_hostover.py)
        self.lifelines: Lifelines | None = None  # their thread, while ``watch`` runs

    # ------------------------------------------------------------ membership

    @property
    def live(self) -> list[Host]:
        """The hosts alive now, by rank."""
        return sorted((h for h in self.hosts if h.alive), key=lambda h: h.rank)

    def on_agent_hello(self, conn: Connection, hello: dict[str, Any]) -> None:
        why = self._hello_refusal(hello)
        if why is not None:
            # Nothing is sent to it and no registration is touched: a live host stays as it is.
            what = f"agent HELLO from {hello.get('agent')!r} (hosts={hello.get('rank')!r})"
            self._rt.node.refusals.refused(hello_peer(conn), f"{what}: {why}")
            conn.abort(f"refused: {why}")
            return
        host_id = str(hello.get("host_id", ""))
        rank: int = hello["rank"] if type(hello.get("rank")) is int else -1
        if self.tokens is not None:  # the token was this rank's: the host is that rank
            given = hello["token"]
            if token_matches(given, self.tokens[rank]):  # the next one: the last is spent now
                self._presented[rank] = given
            if self.takeover is None or self.takeover.active:  # a standby waits (_hostover.py)
                self.rotate_token(conn, rank)
        elif rank < 0 or self._rank_taken(rank):
            rank = next(i for i in range(len(self.hosts) + 1) if not self._rank_taken(i))
        host = Host(
            name=str(hello.get("agent")),
            rank=rank,
            host_id=host_id,
            conn=conn,
            last_seen=trio.current_time(),
        )
        conn.peer = f"agent {host.name}"
        self.hosts.append(host)
        self._by_rank[rank] = host
        resume = hello.get("resume")
        if resume is not None:  # checked by resume_refusal
            host.resumed = dict(resume["procs"])
        if self.takeover is not None:
            self.takeover.registered(host)
        host.lifeline_token = new_registration_token()
        self._rt.node.sys_cast(conn, "lifeline", {"token": host.lifeline_token})
        log.info(
            "host %s registered as hosts=%d (workers on %s)", host.name, rank, hello.get("listen")
        )
        self._registered.set()

    def rotate_token(self, conn: Connection, rank: int) -> None:
        """Give the agent of `rank` (registered on `conn`) the token for its next registration;
        with a takeover, the journal has it first (a standby registers only its holder)."""
        assert self.tokens is not None
        next_token = self.tokens[rank] = new_registration_token()
        if self.takeover is not None:
            self.takeover.token_changed(rank, next_token, self._presented.get(rank))
        self._rt.node.sys_cast(conn, "agent_token", {"token": next_token})

    def token_table(self) -> dict[int, tuple[bytes, bytes | None]] | None:
        """By rank: (the token its agent registers with next, the one it presented last); None
        when the launcher gives no tokens. What ``expect_tokens`` takes."""
        if self.tokens is None:
            return None
        return {rank: (token, self._presented.get(rank)) for rank, token in self.tokens.items()}

    def expect_tokens(self, tokens: dict[int, tuple[bytes, bytes | None]]) -> None:
        """Register only the holders of these tokens, by rank: (the next, the last presented)."""
        self.tokens = {rank: pair[0] for rank, pair in tokens.items()}
        self._presented = {rank: pair[1] for rank, pair in tokens.items() if pair[1] is not None}

    def _hello_refusal(self, hello: dict[str, Any]) -> str | None:
        """Why an agent's HELLO may not register (None: it may). A live host is never replaced:
        with tokens, only the agent holding its rank's unused token registers as that rank, and
        only once its previous registration is dead."""
        host_id = hello.get("host_id")
        if not isinstance(host_id, str) or not host_id:
            return "it carries no host_id"
        if (why := resume_refusal(hello)) is not None:
            return why
        old = next((h for h in self.hosts if h.host_id == host_id), None)
        if old is not None:
            if old.alive:
                return f"host_id {host_id} is registered already, as live host {old.name}"
            return f"host_id {host_id} was declared dead; its agent registers afresh"
        if self.tokens is None:
            return None
        rank = hello.get("rank")
        if type(rank) is not int or rank not in self.tokens:
            return (
                f"its rank is not one this cluster's launcher started (0..{len(self.tokens) - 1})"
            )
        given = hello.get("token")
        if not (
            token_matches(given, self.tokens[rank])
            or token_matches(given, self._presented.get(rank))
        ):
            return (
                "its registration token is missing or wrong (agents get theirs from the launcher)"
            )
        if self._rank_taken(rank):
            return f"hosts={rank} is registered and alive (as {self._by_rank[rank].name})"
        return None

    def on_lifeline_hello(self, conn: Connection, hello: dict[str, Any]) -> None:
        """A registered agent's lifeline: its socket goes to the lifelines' thread."""
        host = next((h for h in self.hosts if h.host_id == hello.get("lifeline")), None)
        why = None
        if host is None or not host.alive or self.lifelines is None:
            why = "it names no live host"
        elif not token_matches(hello.get("token"), host.lifeline_token):
            why = "its lifeline token is missing, wrong or spent"
        elif any(h.conn is conn for h in self.hosts) or self._rt.proc_on(conn) is not None:
            why = "it came on a connection registered already"
        if why is not None or host is None or self.lifelines is None:
            self._rt.node.refusals.refused(hello_peer(conn), f"lifeline HELLO: {why}")
            conn.abort(f"refused: {why}")
            return
        host.lifeline_token = None
        sock, mac = conn.release("handed to the lifelines' thread")
        host.lifeline = Lifeline(sock, mac, host.name)
        self.lifelines.add(host.lifeline)

    def _rank_taken(self, rank: int) -> bool:
        host = self._by_rank.get(rank)
        return host is not None and host.alive

    async def wait_for(self, launcher: Launcher, timeout: float = REGISTER_TIMEOUT) -> None:
        """Wait until the launcher's hosts are registered and alive; SpawnError on failure."""
        n = launcher.hosts
        deadline = trio.current_time() + timeout
        while len(self.live) < n:
            failure = launcher.failure()
            if failure is not None:
                raise SpawnError(f"a host agent failed before registering: {failure}")
            if trio.current_time() > deadline:
                raise SpawnError(
                    f"only {len(self.live)} of {n} host agents registered within {timeout:g} s "
                    f"(controller at {self.address}; see the launcher's output above)"
                )
            with trio.move_on_after(0.2):
                self._registered = trio.Event()
                await self._registered.wait()

    def by_rank(self, rank: int) -> Host | None:
        return self._by_rank.get(rank)

    def host_for(self, index: int) -> Host:
        """The host a slot with ``hosts=index`` runs on (see the module docstring)."""
        host = self._by_rank.get(index)
        if host is None:
            raise SpawnError(
                f"a slot asks for hosts={index}, but this cluster's hosts are "
                f"0..{len(self._by_rank) - 1}"
            )
        if host.alive:
            return host
        if not self.relocate:
            raise SpawnError(f"host {host.name} (hosts={index}) {host.dead_reason}")
        live = self.live
        if not live:
            raise SpawnError("no live host to start a worker on: every host agent is gone")
        return min(live, key=lambda h: (h.live_procs(), h.rank))

    # ------------------------------------------------------------ heartbeats, failure

    def _host(self, payload: Any) -> Host | None:
        host_id = payload.get("host_id") if isinstance(payload, dict) else None
        host = next((h for h in self.hosts if h.host_id == host_id), None)
        return host if host is not None and host.alive else None

    def _beat(self, payload: Any) -> None:
        host = self._host(payload)
        if host is not None:
            host.last_seen = trio.current_time()

    async def watch(self) -> None:
        """Beat to every live agent (and run the lifelines' thread); declare dead those silent
        for HOST_TIMEOUT, those whose lifeline broke, and those whose launch ended."""
        self.lifelines = Lifelines(HEARTBEAT_INTERVAL / 2, LOOP_HELD_LIMIT)
        self.lifelines.start()
        try:
            await self._watch()
        finally:
            self.lifelines.stop()

    async def _watch(self) -> None:
        due = trio.current_time()
        while True:
            if self.lifelines is not None:
                self.lifelines.tick()
            self._launches_ended()
            now = trio.current_time()
            held = now - due
            if held > HELD_WARNING:
                log.warning(
                    "the controller's event loop was held for %.2f s (a synchronous driver step?): "
                    "heartbeats went on, but calls, replies and restarts waited for it; "
                    "run such a step in a thread (await trio.to_thread.run_sync(f))",
                    held,
                )
            due = now + HEARTBEAT_INTERVAL / 2
            timeout = HOST_TIMEOUT
            if self.takeover is not None:
                self.takeover.check_quorum(now)
                timeout = self.takeover.host_timeout()
            for host in self.live:
                line = host.lifeline
                if line is not None and line.close_reason is not None:
                    self.declare_dead(host, f"lost its lifeline ({line.close_reason})")
                # Without a lifeline, a loop just released has not read the beats waiting in
                # its sockets yet: judge next round, not now.
                elif host.silent_for(now) > timeout and (line or held <= HEARTBEAT_INTERVAL):
                    self.declare_dead(host, f"stopped answering (no heartbeat for {timeout:g} s)")
                else:
                    self._rt.node.sys_cast(host.conn, "beat", None)
            await trio.sleep(HEARTBEAT_INTERVAL / 2)

    def _launches_ended(self) -> None:
        """A host whose launch ended (its srun step: Slurm set its node DOWN; its ssh session) is
        lost even while its agent still answers. The agent is told to stop, so it kills its
        workers and exits instead of registering again."""
        ended = getattr(self.launcher, "ended", None)  # a launcher written before it existed
        if ended is None:
            return
        for rank, why in ended().items():
            host = self._by_rank.get(rank)
            if host is not None and host.alive:
                self._rt.node.sys_cast(host.conn, "shutdown", None)
                self.declare_dead(host, why)

    def connection_lost(self, conn: Connection) -> bool:
        host = next((h for h in self.hosts if h.conn is conn), None)
        if host is None:
            return False
        if host.alive:
            self.declare_dead(host, f"lost its agent ({conn.close_reason})")
        else:  # shut down, or already declared dead: what still runs there is gone now
            self._procs_lost(host)
        self._rt.node.fail_pending(conn, f"its host {host.name} is gone")
        return True

    def declare_dead(self, host: Host, why: str) -> None:
        """Every process on `host` exits with a reason naming it; its connections close."""
        if not host.alive:
            return
        host.dead_reason = why
        log.warning("host %s (hosts=%d) declared dead: %s", host.name, host.rank, why)
        host.conn.abort(f"host declared dead: {why}")
        if host.lifeline is not None:
            host.lifeline.close(f"host declared dead: {why}")
        self._procs_lost(host)

    def _procs_lost(self, host: Host) -> None:
        for proc in host.procs.values():
            if proc.alive:
                self._rt.mark_exited(
                    proc, f"was lost with host {host.name}, which {host.dead_reason}"
                )
                if proc.conn is not None:
                    proc.conn.abort(f"host {host.name} is gone")

    # ------------------------------------------------------------ agent reports

    def _proc(self, payload: Any) -> Proc | None:
        host = self._host(payload)
        return host.procs.get(payload["id"]) if host is not None else None

    def _proc_spawned(self, payload: Any) -> None:
        proc = self._proc(payload)
        if proc is not None:
            proc.pid = payload["pid"]

    def _proc_exit(self, payload: Any) -> None:
        proc = self._proc(payload)
        if proc is not None:
            hung = payload.get("hung")
            self._rt.mark_exited(proc, payload["reason"], hung if isinstance(hung, dict) else None)

    def _proc_output(self, payload: Any) -> None:
        proc = self._proc(payload)
        if proc is not None:
            sink = sys.stdout if payload["stream"] == 1 else sys.stderr
            self._rt.output(proc, sink, payload["line"])

    async def spawn(self, host: Host, proc: Proc, env: dict[str, str], cfg: dict[str, Any]) -> None:
        host.procs[proc.proc_id] = proc
        request = {"id": proc.proc_id, "env": env, "cfg": cfg}
        try:
            await self._rt.node.sys_call(host.conn, "spawn_proc", request, proc.proc_id)
        except (ActorError, ActorDiedError, trio.ClosedResourceError) as exc:
            self._rt.mark_exited(proc, f"could not be forked on host {host.name}: {exc}")

    async def request_stacks(self, proc: Proc, timeout: float) -> dict[str, Any] | str:
        """What `proc`'s actors are doing now, asked through its host's agent."""
        host = proc.host
        if host is None or not host.alive:
            return f"its host {host.name if host else '?'} is gone"
        try:
            with trio.move_on_after(timeout + 1.0):
                answer = await self._rt.node.sys_call(
                    host.conn, "proc_stacks", {"id": proc.proc_id, "timeout": timeout}, proc.proc_id
                )
                return answer if isinstance(answer, dict | str) else repr(answer)
        except (ActorError, ActorDiedError, trio.ClosedResourceError) as exc:
            return f"its host {host.name} could not be asked: {exc}"
        return f"no answer from its host {host.name} within {timeout + 1.0:g} s"

    def kill(self, proc: Proc) -> None:
        host = proc.host
        if host is not None and host.alive:
            self._rt.node.sys_cast(host.conn, "kill_proc", {"id": proc.proc_id})

    async def shutdown(self) -> None:
        """Stop every agent (each kills its workers first) and wait for the workers' exits."""
        for host in self.live:
            # Its lifeline stays open: closed first, it could tell the agent that the controller
            # was lost (keep the workers for a standby) before "shutdown" arrives.
            host.dead_reason = "was shut down"
            for proc in host.procs.values():
                proc.shut_down = True
            self._rt.node.sys_cast(host.conn, "shutdown", None)
        with trio.move_on_after(3.0):
            for host in self.hosts:
                for proc in host.procs.values():
                    await proc.exited.wait()
