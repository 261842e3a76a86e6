"""The controller's runtime: its node, the fork server, and the worker processes it started.

One runtime per trio run (a RunVar, not a process-wide global), created on first use. Its tasks
are trio system tasks: they live as long as the run and are cancelled when it ends, which closes
every socket, so the workers and the fork server notice and exit.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import trio

from .._core._dumpable import make_undumpable
from .._core._errors import SpawnError
from .._node._failure import MeshFailure
from .._node._mainmodule import this_main
from .._node._node import Node, set_current_node
from .._wire._connection import Connection
from .._wire._owntasks import spawn as spawn_own
from ..rdma._channel import Channel
from . import _spare
from ._deaths import Deaths
from ._exitnews import ExitListener, HearsExits
from ._forkclient import ForkServer
from ._hangs import WatchesPipes
from ._hellos import SPAWN_TIMEOUT, ChecksHellos
from ._proc import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, Proc, beat_interval
from ._statedir import TakeoverState
from ._watchdog import Watchdog

log = logging.getLogger("otpmesh.runtime")

_RUNTIME: trio.lowlevel.RunVar[Runtime] = trio.lowlevel.RunVar("otpmesh_runtime")
_STARTING: trio.lowlevel.RunVar[tuple[trio.Event, Runtime]] = trio.lowlevel.RunVar(
    "otpmesh_runtime_starting"
)
#: What the layers above serve from the controller's node (registered when they are imported):
#: each is called with every new runtime.
SERVICES: list[Callable[[Runtime], None]] = []


class Runtime(ChecksHellos, HearsExits, WatchesPipes):
    """Everything the controller owns for one trio run."""

    def __init__(self, secret: bytes | None = None) -> None:
        # No actor may read the controller's memory (the secret, every actor's arguments): it is
        # not dumpable from here on. The fork server is started with execve, which makes it (and
        # the workers it forks) dumpable again.
        make_undumpable()
        self.node = Node(
            "ctl",
            sys_handlers={"resolve_actor": self._resolve_actor, "death_of": self._death_of},
            channel=Channel,
            is_app_process=self._is_worker,
            secret=secret,  # a standby's: the app's it takes over (_takeover.py)
        )
        self.node.sys_inline["actor_exited"] = self._actor_exited
        self.node.sys_inline["actor_exiting"] = self._actor_exiting
        self.node.on_hello = self._on_hello
        self.node.on_connection_lost = self._on_connection_lost
        self.procs: dict[str, Proc] = {}
        self._by_pid: dict[int, Proc] = {}
        # Lookups that a thousand processes make hot, each O(1) rather than a scan of `procs`
        # (every actor exit, lost connection and worker request did one): the process behind a
        # connection, and the process hosting an actor path (Proc.hosted keeps it).
        self._by_conn: dict[Connection, Proc] = {}
        self._host_of: dict[str, Proc] = {}
        self.forkserver = ForkServer(self._fork_server_report, self._fork_server_gone)
        #: The hosts of ``otpmesh.cluster``, when one is attached (else every worker is local).
        self.cluster: Any = None
        self._next_proc = 0
        # Who hears of an actor's exit, by actor path (a supervisor); others are only logged.
        self.exit_listeners: dict[str, ExitListener] = {}
        #: Told of every actor exit after its listener (what an actor owned is stopped with it).
        self.exit_hooks: list[Callable[[str, int, object], None]] = []
        #: Told of the abnormal exits of actors nobody owns (meshes the controller spawned for
        #: itself, outside any tree): otpmesh.monarch's unhandled-fault hook listens here.
        self.unowned_failures: list[Callable[[MeshFailure], None]] = []
        self._fork_server_started = False
        #: With a takeover set up (_takeover.py): the epoch, the fork server's standby socket
        #: and grace, and where workers write while no controller reads their pipes.
        self.takeover: TakeoverState | None = None
        self._spare_asked = False  # a spare is to be asked for (want_spare)
        #: How it hears of a local worker's death, first from its death lock (_deaths.py).
        self.deaths = Deaths(self.node, self.forkserver, self.procs, self._by_pid, self.mark_exited)
        self.nursery: trio.Nursery | None = None
        #: What actors own, by path (otpmesh._controller._owners; the layer above keeps it).
        self.owners: Any = None
        #: What it answers any process of the app (otpmesh._controller._owned's Service).
        self.service: Any = None
        #: A takeover's journal of every tree's child lists (otpmesh._controller._livejournal).
        self.live_journal: Any = None
        for install in SERVICES:
            install(self)

    def _is_worker(self, pid: int) -> bool:
        """Whether `pid` is one of this app's workers on this host: a child of its fork server
        (known before the fork server's report of it arrives, so a worker dialing back at once
        is never a stranger)."""
        return pid in self._by_pid or self.forkserver.forked(pid)

    # ------------------------------------------------------------ life cycle

    async def _main(self, started: trio.Event) -> None:
        self.deaths.start()
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                await nursery.start(self.node.serve)
                # Progress deadlines of the actors placed in this process (placement="local").
                watchdog = Watchdog(
                    lambda: self.node.actors,
                    beat_fd=None,
                    control_fd=None,
                    interval=HEARTBEAT_INTERVAL,
                    token=trio.lowlevel.current_trio_token(),
                    may_kill=False,
                ).start()
                started.set()
                try:
                    await trio.sleep_forever()
                finally:
                    watchdog.stop()
        except Exception:
            log.exception("otpmesh runtime failed")
            started.set()
        finally:
            self.deaths.stop()

    def _fork_server_report(self, msg: dict[str, Any]) -> None:
        if msg["op"] == "spawned":
            proc = self.procs.get(msg["id"])
            if proc is not None:
                proc.pid = msg["pid"]
                proc.lock_page = msg.pop("page", None)  # watched once it says it holds it
                self._by_pid[proc.pid] = proc
                proc.forked.set()
        elif msg["op"] == "exit":
            proc = self._by_pid.pop(msg["pid"], None)
            if proc is not None:
                self.deaths.reaped(proc, msg["reason"])

    def _fork_server_gone(self) -> None:
        for proc in self.procs.values():
            if proc.host is None:
                self.mark_exited(proc, "was killed: the fork server stopped")

    def mark_exited(self, proc: Proc, reason: str, hung: dict[str, Any] | None = None) -> None:
        """`proc` is gone, for `reason` (its actors' exits follow from its lost connection)."""
        if not proc.exited.is_set() and self.takeover is not None:
            self.takeover.proc_exited(proc)
        if proc.pipes is not None:
            why = proc.exit_reason or proc.hang_reason or reason
            proc.pipes.close(f"its process {why}")  # reads a hang report first
        if hung is not None and proc.hung is None:
            proc.hung = hung
        if proc.exit_reason is None:
            proc.exit_reason = proc.hang_reason or reason
        self.node.relays.pop(proc.addr, None)
        if proc.lock_page is not None:
            os.close(proc.lock_page)
            proc.lock_page = None
        proc.exited.set()
        proc.ready.set()
        proc.forked.set()

    async def request_stacks(self, proc: Proc, timeout: float) -> dict[str, Any] | str:
        """What `proc`'s actors are doing now (its watchdog answers, even while the event loop
        is blocked), or why there is no answer."""
        if proc.host is not None:
            answer: dict[str, Any] | str = await self.cluster.request_stacks(proc, timeout)
            return answer
        if not proc.alive or proc.pipes is None:
            return f"its process {proc.exit_reason or 'is gone'}"
        return await proc.pipes.ask_stacks(timeout)

    # ------------------------------------------------------------ processes

    async def start_procs(
        self,
        shape: dict[str, int],
        coords: list[dict[str, int]],
        envs: list[dict[str, str]],
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
    ) -> list[Proc]:
        """Fork one worker per slot and wait until each has dialed back (or died).

        With a cluster attached (``otpmesh.cluster``), a slot's ``hosts`` coordinate names the
        host whose agent forks it; otherwise every worker is forked on this host.
        """
        hosts = [self._host_for(point) for point in coords]
        if any(h is None for h in hosts):
            await self._start_fork_server()
        procs = []
        for rank, (point, env, host) in enumerate(zip(coords, envs, hosts, strict=True)):
            self._next_proc += 1
            proc = Proc(rank=rank, coords=point, proc_id=f"p{self._next_proc}", host=host)
            proc.index = self._host_of
            proc.heartbeat_timeout = heartbeat_timeout
            self.procs[proc.proc_id] = proc
            procs.append(proc)
            if host is None:
                await self._fork(proc, env)
            else:
                cfg = self._worker_cfg(proc, self.cluster.address)
                await self.cluster.spawn(host, proc, env, cfg)
        with trio.move_on_after(SPAWN_TIMEOUT):
            for proc in procs:
                await proc.ready.wait()
        failed = [p for p in procs if p.conn is None]
        if failed:
            for proc in procs:
                self.kill(proc)
            why = "; ".join(
                f"rank {p.rank}: {p.exit_reason or f'no answer within {SPAWN_TIMEOUT:g} s'}"
                for p in failed
            )
            raise SpawnError(f"could not start {len(failed)} worker process(es): {why}")
        return procs

    def _host_for(self, point: dict[str, int]) -> Any:
        if self.cluster is None or "hosts" not in point:
            return None
        return self.cluster.host_for(point["hosts"])

    async def _start_fork_server(self) -> None:
        if not self._fork_server_started and self.nursery is not None:
            # Started on first use: a tree run with placement="local" never needs one.
            self._fork_server_started = True
            standby = self.takeover.for_fork_server(self.node.secret) if self.takeover else None
            await self.nursery.start(self.forkserver.run, standby)
        await self.forkserver.ready.wait()
        if self.forkserver.gone:
            raise SpawnError("the otpmesh fork server has stopped; no new workers can start")

    def adopted(self, proc: Proc) -> None:
        """Know `proc`, a process a standby takes over (_adoption.py), by its id and pid."""
        proc.index = self._host_of
        self.procs[proc.proc_id] = proc
        self._by_pid[proc.pid] = proc
        number = proc.proc_id.removeprefix("p")
        if number.isdigit():  # this controller's own processes are numbered after it
            self._next_proc = max(self._next_proc, int(number))

    async def attach_fork_server(self, path: str, epoch: int) -> list[int]:
        """Take over the fork server listening at `path`; the pids of its live children."""
        assert self.nursery is not None
        self._fork_server_started = True
        try:
            children: list[int] = await self.nursery.start(
                self.forkserver.attach, path, self.node.secret, epoch
            )
        except OSError:  # gone: a fresh one is started on first use
            self._fork_server_started = False
            self.forkserver = ForkServer(self._fork_server_report, self._fork_server_gone)
            raise
        return children

    def _worker_cfg(self, proc: Proc, controller: str | None) -> dict[str, Any]:
        return {
            **self._app_cfg(controller),
            "proc": proc.proc_id,
            # Presented in its HELLO: no other holder of the secret can register as it.
            "token": proc.token,
            # Per process (its output file), so a spare, started from the app's part, is not
            # taken for an app with a takeover set up: a fresh fork gets these.
            **(self.takeover.for_worker(proc.proc_id) if self.takeover else {}),
        }

    def _app_cfg(self, controller: str | None) -> dict[str, Any]:
        """What every worker of this app is started with, whichever process it will be."""
        return {
            "controller": controller,
            "sys_path": list(sys.path),
            "cwd": os.getcwd(),
            "log_level": logging.getLogger("otpmesh").getEffectiveLevel(),
            # Where __main__'s classes come from: its file, or its definitions (_mainmodule.py).
            **this_main().to_cfg(),
            # A host agent's worker is watched with the agent's own timeout, unknown here.
            "heartbeat_interval": HEARTBEAT_INTERVAL,
        }

    def want_spare(self) -> None:
        """Have this host's fork server start a spare worker for the next process it forks
        (_spare.py), unless it has one: called once an actor is up. Asked a moment later, so
        that forking it (a torch-sized page table copied) does not compete for the CPU with
        the calls waiting for that actor."""
        if _spare.WANTED and self.nursery is not None and not self._spare_asked:
            self._spare_asked = True
            self.nursery.start_soon(self._ask_for_spare)

    async def _ask_for_spare(self) -> None:
        await trio.sleep(_spare.ASK_AFTER)
        self._spare_asked = False
        if self.forkserver.ready.is_set() and not self.forkserver.gone:
            self.forkserver.want_spare(self._secret_cfg(self._app_cfg(self.node.addr)))

    def retire_spare(self) -> None:
        """No spare worker now (the tree that would restart processes has stopped)."""
        if self.forkserver.ready.is_set() and not self.forkserver.gone:
            self.forkserver.want_spare(None)

    def _secret_cfg(self, cfg: dict[str, Any]) -> dict[str, Any]:
        # The secrets ride the fork server's private socket pair, never argv or the environment
        # (a host agent gives its workers the cluster's instead: this app's never leaves it).
        return dict(cfg, secret=self.node.secret, tcp_secret=self.node.tcp_secret)

    async def _fork(self, proc: Proc, env: dict[str, str]) -> None:
        assert self.nursery is not None
        cfg = self._secret_cfg(self._worker_cfg(proc, self.node.addr))
        cfg["heartbeat_interval"] = beat_interval(proc.heartbeat_timeout)  # watched here
        self.watch_pipes(proc, *await self.forkserver.spawn(proc.proc_id, env, cfg))

    def shutdown(self, proc: Proc, payload: Any) -> None:
        """Ask a worker to stop its actors and exit (its death lock's release is then no news)."""
        if proc.alive and proc.conn is not None:
            proc.stop_asked = True
            self.node.sys_cast(proc.conn, "shutdown", payload)

    def kill(self, proc: Proc) -> None:
        """SIGKILL a worker (through its fork server, its parent, so the exit is reported)."""
        if not proc.alive:
            return
        if proc.host is not None:
            self.cluster.kill(proc)
        else:
            self.forkserver.kill(proc.pid)


async def runtime(secret: bytes | None = None) -> Runtime:
    """The controller runtime of the current trio run, started on first use (with `secret`: a
    standby's, which must be the first use)."""
    try:
        rt = _RUNTIME.get()
    except LookupError:
        pass
    else:
        if secret is not None and secret != rt.node.secret:
            raise SpawnError(
                "otpmesh.start(takeover=...) must be the first otpmesh call of its trio run: the "
                "standby's runtime needs the app's secret from the start"
            )
        return rt
    try:
        starting, rt = _STARTING.get()
    except LookupError:
        starting, rt = trio.Event(), Runtime(secret)
        _STARTING.set((starting, rt))
        spawn_own(rt._main, starting, name="otpmesh-runtime")
    await starting.wait()
    # Every waiter wakes at once, in no set order (trio shuffles them): whichever runs first
    # makes the runtime current, so none can find it not yet set.
    if rt.nursery is None:
        raise SpawnError("the otpmesh runtime failed to start (see the log above)") from None
    try:
        _RUNTIME.get()
    except LookupError:
        _RUNTIME.set(rt)
        set_current_node(rt.node)
    return rt
