"""The host agent: one per host, dials the controller and forks that host's worker processes.

``otpmesh agent --controller tcp:HOST:PORT`` (or ``python -m otpmesh._hosts._agent``) runs it. It
authenticates with the cluster secret, registers, and then serves the controller's requests:

    spawn_proc {id, env, cfg}   fork a worker from this host's pre-warmed fork server
    kill_proc {id}              SIGKILL one
    fanout {...}                relay one broadcast to several local workers (_fanout.py)
    shutdown                    kill every worker and exit

and reports what it sees: ``proc_spawned``, ``proc_exit`` (from the fork server's SIGCHLD, not
polling), ``proc_output`` (a line a worker printed) and ``beat`` every HEARTBEAT_INTERVAL, here
and on its lifeline (_agentlife.py), which the controller serves from a thread: a held
controller loop does not stop its beats. With no controller beat on either for AGENT_TIMEOUT
(shorter than its HOST_TIMEOUT), the agent kills its workers *before* the controller declares
the host dead and restarts their actors elsewhere, so no actor runs twice; then it registers
afresh, as a new host, for up to `reconnect` seconds. With a takeover, it keeps them for a
standby instead (_agentgrace.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import uuid
from functools import partial
from typing import Any

import trio

from .._core._dumpable import make_undumpable
from .._core._errors import ProtocolError
from .._node._node import Node
from .._node._relay import Relay
from .._runtime._forkclient import ForkServer
from .._runtime._workerpipes import BeatReader, WorkerPipes, forward_lines, watch_heartbeat
from .._wire import _codec
from .._wire._connection import Connection
from .._wire._frames import HELLO, decode_frame
from .._wire._handshake import dial
from .._wire._secret import SecretError, load_secret
from ._agentcli import parser as parser
from ._agentgrace import AgentGrace
from ._agentlife import AgentLifeline
from ._cluster import HEARTBEAT_INTERVAL, HOST_TIMEOUT

log = logging.getLogger("otpmesh.agent")

#: The agent gives up on the controller sooner, so its workers are gone before any restart.
AGENT_TIMEOUT = 0.75 * HOST_TIMEOUT
DIAL_TIMEOUT = 5.0
WORKER_HEARTBEAT_TIMEOUT = float(os.environ.get("OTPMESH_HEARTBEAT_TIMEOUT", "2.0"))


class _Proc:
    def __init__(self, proc_id: str) -> None:
        self.proc_id = proc_id
        self.pid = 0
        self.alive = True
        self.hang_reason: str | None = None
        self.hung: dict[str, Any] | None = None  # its watchdog's report (_watchdog.py)
        self.pipes: WorkerPipes | None = None


class Agent:
    """One host's agent. ``await agent.run()`` serves until shut down or out of retries."""

    def __init__(
        self,
        controller: str,
        secret: bytes,
        *,
        listen: str | None = None,
        rank: int | None = None,
        name: str | None = None,
        reconnect: float = 60.0,
        token: bytes | None = None,
    ) -> None:
        # One address, or several separated by commas: a takeover's controllers, tried in turn.
        self.controllers = [
            c if c.startswith("tcp:") else f"tcp:{c}" for c in controller.split(",")
        ]
        self.controller = self.controllers[0]
        self.secret = secret
        # The one-time token its next HELLO presents: its launcher's first, then the one each
        # registration hands it for the next (None: a Static agent, which has none).
        self.token = token
        self.listen = listen
        self.rank = rank
        self.name = name or socket.gethostname()
        self.reconnect = reconnect
        self.node = Node(
            "agent",
            sys_handlers={
                "spawn_proc": self._spawn_proc,
                "kill_proc": self._kill_proc,
                "proc_stacks": self._proc_stacks,
                "shutdown": self._shutdown,
            },
            secret=secret,
            tcp_secret=secret,
            is_app_process=self._is_worker,
        )
        ops = ("spawn_proc", "kill_proc", "proc_stacks", "shutdown", "fanout", "beat")
        self.node.parent_ops = frozenset((*ops, "agent_token", "takeover", "lifeline"))
        self.grace = AgentGrace(self)
        self.relay = Relay(self.node)
        lifeline = self.lifeline = AgentLifeline(self._beat, HEARTBEAT_INTERVAL / 2)
        self.node.sys_inline |= {"takeover": self.grace.on_takeover, "beat": self._beat}
        self.node.sys_inline |= {"agent_token": self._next_token, "lifeline": lifeline.on_token}
        self.forkserver = ForkServer(self._report, self._forkserver_gone)
        self.procs: dict[str, _Proc] = {}
        self._by_pid: dict[int, _Proc] = {}
        self.conn: Connection | None = None
        self.host_id = ""
        self._last_beat = 0.0
        self._stopping = False

    def _is_worker(self, pid: int) -> bool:
        """Whether `pid` is one of this host's workers (a child of this agent's fork server)."""
        return pid in self._by_pid or self.forkserver.forked(pid)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.node.serve)
            await nursery.start(self.forkserver.run)
            nursery.start_soon(self.relay.run)
            await self.forkserver.ready.wait()
            give_up = trio.current_time() + self.reconnect
            while not self._stopping:
                try:
                    await self._session()
                    give_up = trio.current_time() + self.reconnect
                except (OSError, ProtocolError, trio.TooSlowError) as exc:
                    level = logging.DEBUG if self.grace.waiting else logging.WARNING
                    log.log(level, "agent %s: cannot reach %s: %s", self.name, self.controller, exc)
                if not self._stopping and self.grace.keeps_workers():
                    # Waiting for a standby: the next address of the list, at once.
                    i = self.controllers.index(self.controller) + 1
                    self.controller = self.controllers[i % len(self.controllers)]
                    give_up = max(give_up, trio.current_time() + self.reconnect)
                    await trio.sleep(0.05)
                    continue
                self._kill_all()
                if self._stopping or trio.current_time() > give_up:
                    break
                await trio.sleep(0.2)
            nursery.cancel_scope.cancel()

    async def _session(self) -> None:
        """One registration: from dialing the controller until it is lost."""
        # A host cut off must not wait out TCP's retries.
        with trio.fail_after(self.grace.dial_timeout(DIAL_TIMEOUT)):
            sock, mac = await dial(self.controller, self.secret)
        self.host_id = uuid.uuid4().hex
        conn = Connection(
            sock,
            peer=self.controller,
            decode=decode_frame,
            on_message=self.node.dispatch,
            mac=mac,
        )
        self.conn = conn
        self.node.parent = conn
        self.node.register(self.controller, conn)
        hello: dict[str, Any] = {
            "agent": self.name,
            "host_id": self.host_id,
            "rank": self.rank,
            "pid": os.getpid(),
            "listen": self._listen_host(),
            **self.grace.hello(),
        }
        if self.token is not None:
            hello["token"] = self.token
        conn.send_nowait(_codec.pack([HELLO, hello]))
        self._last_beat = trio.current_time()
        log.info("agent %s registered with %s as %s", self.name, self.controller, self.host_id)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._beat_loop, conn)
            nursery.start_soon(self.lifeline.run, conn, self.controller, self.secret, self.host_id)
            await self.node.run_connection(conn)
            nursery.cancel_scope.cancel()
        if not self._stopping:
            log.warning("agent %s lost the controller: %s", self.name, conn.close_reason)

    async def _beat_loop(self, conn: Connection) -> None:
        """Beat as often as the controller does, and fence the moment AGENT_TIMEOUT has passed
        since its last beat: both by this host's own monotonic clock, never compared with the
        controller's, so wall-clock skew is harmless (docs/multihost.md gives the margin)."""
        next_beat = trio.current_time()
        while not conn.closed:
            now = trio.current_time()
            if now - self._last_beat >= AGENT_TIMEOUT:
                if not self.grace.keeps_workers():
                    log.warning("agent %s: no heartbeat from the controller; fencing", self.name)
                    self._kill_all()  # before the controller restarts our actors elsewhere
                conn.abort("the controller stopped answering")
                return
            if self.grace.ran_out():  # a standby that came to nothing: kill as above
                self._kill_all()
                conn.abort("no controller took over within the grace period")
                return
            if now >= next_beat:
                self.node.sys_cast(conn, "beat", {"host_id": self.host_id})
                next_beat = now + HEARTBEAT_INTERVAL / 2
            await trio.sleep_until(min(next_beat, self._last_beat + AGENT_TIMEOUT))

    def _beat(self, payload: Any) -> None:
        self._last_beat = trio.current_time()

    def _next_token(self, payload: Any) -> None:
        """Registered: the token it used is spent; this one is for its next registration."""
        token = payload.get("token") if isinstance(payload, dict) else None
        if type(token) is bytes:
            self.token = token

    # ------------------------------------------------------------ requests

    async def _spawn_proc(self, conn: Connection | None, p: dict[str, Any]) -> None:
        proc = _Proc(p["id"])
        self.procs[proc.proc_id] = proc
        host = self._listen_host()
        cfg = dict(p["cfg"], listen=f"tcp:{host}", secret=self.secret, tcp_secret=self.secret)
        cfg = self.grace.worker_cfg(cfg)
        # Which host a worker is on; and its tensor channel's TCP fallback must be reachable
        # from other hosts, not only on loopback.
        env = dict(p["env"], OTPMESH_HOST=self.name)
        env.setdefault("OTPMESH_RDMA_TCP_HOST", host.strip("[]"))
        out_r, err_r, beat_r, ctl_w = await self.forkserver.spawn(proc.proc_id, env, cfg)
        proc.pipes = WorkerPipes(beat_r, ctl_w, partial(setattr, proc, "hung"))
        assert self.node.nursery is not None
        start = self.node.nursery.start_soon
        start(forward_lines, out_r, partial(self._output, proc, 1))
        start(forward_lines, err_r, partial(self._output, proc, 2))
        start(self._watch, proc, proc.pipes.reader)

    async def _proc_stacks(self, conn: Connection | None, p: dict[str, Any]) -> object:
        """What a worker's actors are doing now, from its watchdog (or why there is no answer)."""
        proc = self.procs.get(str(p.get("id")))
        if proc is None or not proc.alive or proc.pipes is None:
            return "its process is gone"
        return await proc.pipes.ask_stacks(min(float(p.get("timeout", 1.0)), 10.0))

    def _listen_host(self) -> str:
        if self.listen:
            return self.listen
        assert self.conn is not None
        host: str = self.conn.sock.getsockname()[0]
        return f"[{host}]" if ":" in host else host

    async def _kill_proc(self, conn: Connection | None, p: dict[str, Any]) -> None:
        proc = self.procs.get(p["id"])
        if proc is not None and proc.alive:
            self.forkserver.kill(proc.pid)

    async def _shutdown(self, conn: Connection | None, p: Any) -> None:
        self._stopping = True
        self._kill_all()
        if self.conn is not None:
            self.conn.abort("shut down by the controller")

    def _kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.alive:
                self.forkserver.kill(proc.pid)

    # ------------------------------------------------------------ reports

    def _send(self, op: str, payload: dict[str, Any]) -> None:
        if self.conn is not None and not self.conn.closed:
            self.node.sys_cast(self.conn, op, dict(payload, host_id=self.host_id))

    def _report(self, msg: dict[str, Any]) -> None:
        if msg["op"] == "spawned":
            proc = self.procs.get(msg["id"])
            if proc is not None:
                proc.pid = msg["pid"]
                self._by_pid[proc.pid] = proc
                self._send("proc_spawned", {"id": proc.proc_id, "pid": proc.pid})
        elif msg["op"] == "exit":
            proc = self._by_pid.pop(msg["pid"], None)
            if proc is not None:
                del self.procs[proc.proc_id]
                self._gone(proc)
                reason = proc.hang_reason or msg["reason"]
                report: dict[str, Any] = {"id": proc.proc_id, "reason": reason}
                if proc.hung is not None:
                    report["hung"] = proc.hung
                self._send("proc_exit", report)

    @staticmethod
    def _gone(proc: _Proc) -> None:
        """`proc` exited: read what it wrote last (a hang report), close its control pipe."""
        proc.alive = False
        if proc.pipes is not None:
            proc.pipes.close("its process is gone")

    def _forkserver_gone(self) -> None:
        for proc in self.procs.values():
            self._gone(proc)
            self._send(
                "proc_exit", {"id": proc.proc_id, "reason": "its host's fork server stopped"}
            )
        self.procs.clear()

    def _output(self, proc: _Proc, stream: int, line: bytes) -> None:
        self._send("proc_output", {"id": proc.proc_id, "stream": stream, "line": line})

    async def _watch(self, proc: _Proc, reader: BeatReader) -> None:
        def hung(why: str) -> None:
            proc.hang_reason = f"{why} and was killed"
            self.forkserver.kill(proc.pid)

        await watch_heartbeat(
            reader, WORKER_HEARTBEAT_TIMEOUT, lambda: proc.alive, hung, lambda: proc.pid
        )


async def _exit_on_stdin_eof() -> None:
    """A launcher that holds our stdin (local, SSH) ends us by closing it, or by dying."""
    stream = trio.lowlevel.FdStream(os.dup(0))
    try:
        while await stream.receive_some(4096):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


def run_agent(args: argparse.Namespace) -> int:
    """Run an agent as the parsed command line `args` says; return the exit status."""
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    controller = args.controller if args.controller.startswith("tcp:") else f"tcp:{args.controller}"
    rank = args.rank
    if args.rank_from_env:
        try:
            rank = int(os.environ[args.rank_from_env])
        except (KeyError, ValueError):
            print(f"otpmesh agent: ${args.rank_from_env} is not set to a number", file=sys.stderr)
            return 2
    make_undumpable()  # before the secret is read: no actor of this host may read it here
    token = None
    try:
        secret = sys.stdin.buffer.readline().strip() if args.secret_stdin else load_secret()
        if args.token_stdin:
            token = sys.stdin.buffer.readline().strip() or None
        # Not left in the environment, where the fork server and every worker would inherit
        # it (and /proc/PID/environ shows it): the workers get it in their fork request.
        os.environ.pop("OTPMESH_SECRET", None)
    except SecretError as exc:
        print(f"otpmesh agent: {exc}", file=sys.stderr)
        return 2
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the fork server's workers
    agent = Agent(
        controller,
        secret,
        listen=args.listen,
        rank=rank,
        name=args.name,
        reconnect=args.reconnect,
        token=token,
    )

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            if args.secret_stdin:

                async def until_stdin_eof() -> None:
                    await _exit_on_stdin_eof()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until_stdin_eof)
            await agent.run()
            nursery.cancel_scope.cancel()

    try:
        trio.run(run)
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_agent(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
