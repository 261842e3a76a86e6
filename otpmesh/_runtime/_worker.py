"""The worker process: a node that hosts actors, started by the fork server for one mesh slot."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import trio

from .._core._dumpable import isolate_worker
from .._core._errors import EncodeError, FencedError, ProtocolError
from .._core._exits import ActorCrash, Hung
from .._core._reasons import SHUTDOWN
from .._node import _raised
from .._node._calls import CallGroup
from .._node._host import STARTED, ActorHost, StartFailed, spawn_request
from .._node._mainmodule import MainModule, take_argv
from .._node._node import Node, set_current_node
from .._wire import _codec
from .._wire._connection import Connection
from .._wire._framemac import FrameMac
from .._wire._frames import HELLO, decode_frame
from .._wire._handshake import dial
from .._wire._unproven import parent_pid
from ..rdma._channel import Channel
from . import _deathlock, _spare
from ._lease import holds
from ._peerloss import PeerLoss
from ._watchdog import Watchdog

log = logging.getLogger("otpmesh.worker")

#: The actor a spare warms up with (``_warmup.py``: named, so that the spare imports it, not
#: the fork server), and where it lives for the few milliseconds it runs.
WARMUP_CLASS = "otpmesh._runtime._warmup:Warmup"
WARMUP_PATH = "otpmesh.spare/warmup"

#: How long an adoption waits for the old controller's connection to be seen closed.
ADOPT_WAIT = 1.0
#: How long a worker waits for its controller to accept and prove its connection: as long as the
#: controller waits for its HELLO (SPAWN_TIMEOUT). A controller starting a thousand workers at
#: once accepts and proves them in turn; with a dialer's 10 s, 117 of 1,000 workers timed out in
#: the listen backlog and exited while a slowed controller was still working through it.
CONTROLLER_DIAL_TIMEOUT = 60.0


def _kin_of_this_worker(adopters: set[int]) -> Callable[[int], bool]:
    """Which peers a worker counts as its app's own: its fork server (its parent), the
    controller or host agent that runs that server (its grandparent), and its siblings (the
    server's other children: actors call each other directly). Read once, at start: a worker
    whose fork server is gone is about to go too. docs/security.md says why these. A controller
    that took this worker over (`adopters`, filled as it happens) is kin too."""
    fork_server = os.getppid()
    controller = parent_pid(fork_server)

    def kin(pid: int) -> bool:
        return pid in (fork_server, controller) or pid in adopters or parent_pid(pid) == fork_server

    return kin


class Worker:
    """The state of one worker process: its node, its actors and the controller connection."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self._adopters: set[int] = set()
        #: The fencing epoch of the controller served: a takeover must present a higher one.
        self.epoch: int = int(cfg.get("epoch", 0))
        #: With a takeover set up: how long to wait for a standby controller, and where this
        #: process's output goes meanwhile (its pipes led to the controller that died).
        self.takeover: dict[str, Any] | None = cfg.get("takeover")
        self._adopted = trio.Event()
        self.node = Node(
            "w",
            sys_handlers={
                "spawn_actor": self._spawn_actor,
                "stop_actor": self._stop_actor,
                "shutdown": self._shutdown,
                "inject": self._inject,
                "partition": self._partition,
                "adopt": self._adopt,
            },
            listen=cfg.get("listen"),  # a host agent's worker: TCP, reachable from other hosts
            secret=cfg["secret"],
            tcp_secret=cfg.get("tcp_secret"),
            channel=Channel,
            is_app_process=_kin_of_this_worker(self._adopters),
        )
        # Another actor's connection (authenticated: it is one of ours) may call and cast, but
        # only the controller or agent that forked this process may run or stop actors in it.
        self.node.parent_ops = frozenset(
            {"spawn_actor", "stop_actor", "shutdown", "inject", "partition", "peer_dying"}
        )
        # Inline, in the order sent: whatever the controller sends after it finds it done.
        self.node.sys_inline["peer_dying"] = self.node.peer_dying
        # A peer's calls fail with how its process died, as the controller says it.
        self.node.on_connection_lost = PeerLoss(self.node, lambda: self.controller)
        self.host = ActorHost(
            self.node,
            self._actor_exited,
            self._actor_exiting,
            main=MainModule.from_cfg(cfg),
            passing=_raised.IN_WORKER,  # SIGINT is ignored here: a KeyboardInterrupt is the actor's
        )
        self.controller: Connection | None = None
        self.watchdog: Watchdog | None = None
        self._done = trio.Event()

    async def main(self) -> None:
        set_current_node(self.node)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.node.serve)
            # A spare proves itself to the controller while it waits (connect, handshake, the
            # secret's challenge: four trips between processes), so a restart that takes it
            # only has to send its HELLO. It runs no user code meanwhile, and the connection
            # serves nothing of its own until the HELLO registers it as a process.
            early = await self._dial() if "spare_fd" in self.cfg else None
            if early is not None:
                async with trio.open_nursery() as warming:  # a task of its own: the actor's
                    warming.start_soon(self._warm_up)  # context stays in its context
            if not await _spare.assignment(self.cfg):  # a spare waits here for its process
                if early is not None:
                    early[1][0].close()
                nursery.cancel_scope.cancel()
                return
            controller = self.cfg["controller"]
            if early is not None and early[0] != controller:  # not the one it was given
                early[1][0].close()
                early = None
            sock, mac = early[1] if early is not None else (await self._dial())[1]
            conn = Connection(
                sock, peer=controller, decode=decode_frame, on_message=self.node.dispatch, mac=mac
            )
            self.controller = conn
            self.node.parent = conn
            self.node.close_hooks.append(self._controller_lost)
            self.node.register(self.cfg["controller"], conn)
            hello = {
                "proc": self.cfg["proc"],
                "pid": os.getpid(),
                "addr": self.node.addr,
                # Its parent handed it the one-time token over a private socket pair (the fork
                # request): it shows the controller that this process is the one forked for it.
                "token": self.cfg.pop("token", None),
                # It holds its death lock: the controller may watch it (_deathlock.py).
                "deathlock": _deathlock.holding(),
            }
            conn.send_nowait(_codec.pack([HELLO, hello]))
            # Its watchdog thread once the HELLO is on its way: starting a thread costs a restart
            # milliseconds on a busy machine, and nothing runs here before this step ends.
            if self.cfg.get("heartbeat_fd") is not None:
                self.watchdog = Watchdog(
                    lambda: self.node.actors,
                    starts=lambda: self.host.starting,
                    beat_fd=self.cfg["heartbeat_fd"],
                    control_fd=self.cfg.get("control_fd"),
                    interval=self.cfg["heartbeat_interval"],
                    token=trio.lowlevel.current_trio_token(),
                    on_fence=self._fenced_by_agent,
                ).start()
            nursery.start_soon(self._serve_controller, conn)
            await self._done.wait()
            nursery.cancel_scope.cancel()

    async def _dial(self) -> tuple[str, tuple[socket.socket, FrameMac | None]]:
        """(the controller's address, its connection proven): dialed from `cfg` now."""
        controller = str(self.cfg["controller"])
        return controller, await dial(
            controller, self.node.secret_for(controller), CONTROLLER_DIAL_TIMEOUT
        )

    async def _serve_controller(self, conn: Connection) -> None:
        # The controller's connection is this process's lifeline: when it goes, so do we
        # (with a takeover set up: unless a standby takes this process over in time).
        await self.node.run_connection(conn)  # its close hook, below, hears the end

    def _controller_lost(self, conn: Connection) -> None:
        if conn is not self.controller:
            return  # a fenced controller's, already replaced
        if self.takeover is None or self.node.nursery is None or self._done.is_set():
            self._done.set()  # no takeover, or this worker is shutting down anyway
            return
        # The pipes to the old controller have no reader now: a print would fail (EPIPE). Now,
        # before any adoption can give this process new ones.
        fd = os.open(self.takeover["output"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        self._adopted = trio.Event()
        try:
            self.node.nursery.start_soon(self._wait_for_takeover, self._adopted)
        except RuntimeError:  # the node is closing: so is this worker
            self._done.set()

    def _fenced_by_agent(self, epoch: int) -> None:
        """This host's agent took a controller at `epoch`: the one served now is fenced off,
        even if its connection still looks open (a partition sends no FIN). Only the agent
        holds the control pipe this comes through; no actor of another process can send it."""
        if epoch > self.epoch and self.controller is not None and not self.controller.closed:
            log.warning("fenced by this host's agent: a controller at epoch %d took over", epoch)
            self.controller.abort(f"fenced: a controller at epoch {epoch} took this host over")

    async def _wait_for_takeover(self, adopted: trio.Event) -> None:
        assert self.takeover is not None
        with trio.move_on_after(float(self.takeover["grace"])):
            await adopted.wait()
            return
        log.warning("no controller took this worker over within its grace period: exiting")
        self._done.set()

    async def _adopt(self, conn: Connection | None, p: dict[str, Any]) -> dict[str, Any]:
        """A standby controller takes this worker over. It proved the app's secret when it
        dialed (a stranger cannot get here); it must present a higher epoch than the one served;
        and only a worker whose controller is gone is taken, on this host only by the lease's
        holder: an actor of the app knows the secret too, and must take no sibling, neither
        from its live controller nor from its standby (docs/security.md)."""
        if self.takeover is None:
            raise ProtocolError("this worker's app runs without a takeover: it is not taken over")
        epoch = p.get("epoch") if isinstance(p, dict) else None
        if conn is None or type(epoch) is not int or type(p.get("addr")) is not str:
            raise ProtocolError("adopt needs the controller's epoch (an int) and address")
        if epoch <= self.epoch:
            raise FencedError(
                f"this worker serves epoch {self.epoch}; a controller at epoch {epoch} is fenced "
                "off (a standby took the app over)"
            )
        # The old controller's death and its lease's release are one event: its EOF may still
        # be on its way here.
        with trio.move_on_after(ADOPT_WAIT):
            while self.controller is not None and not self.controller.closed:
                await trio.sleep(0.01)
        if self.controller is not None and not self.controller.closed:
            raise ProtocolError("this worker's controller is alive: it is not taken over")
        lease = self.takeover.get("lease")
        if isinstance(lease, str) and conn.peer_pid is not None and not holds(lease, conn.peer_pid):
            # On this host (a Unix socket: the kernel's word on its pid) only the lease's
            # holder adopts: an actor of the app knows the secret, but not the lease.
            raise ProtocolError(
                f"pid {conn.peer_pid} does not hold the takeover's lease: it is not taken over"
            )
        self.epoch = epoch
        self.controller = conn
        self.node.parent = conn
        self.node.register(p["addr"], conn)
        if conn.peer_pid is not None:
            self._adopters.add(conn.peer_pid)
        rewired = self._rewire(conn, p.get("pipes"))
        self._adopted.set()
        return {
            "pid": os.getpid(),
            "addr": self.node.addr,
            "actors": {path: cell.incarnation for path, cell in self.node.actors.items()},
            "rewired": rewired,
        }

    def _rewire(self, conn: Connection, keys: Any) -> bool:
        """Output, heartbeats and stack requests through the pipes the new controller passed
        with its adoption (their worker ends), if it passed all four."""
        names = ("out", "err", "beat", "control")
        fds = [conn.take_fd(keys.get(n)) if isinstance(keys, dict) else None for n in names]
        if any(fd is None for fd in fds) or self.watchdog is None:
            for fd in fds:
                if fd is not None:
                    os.close(fd)
            return False  # its output stays in the state directory's file; no beats
        out, err, beat, control = fds
        assert out is not None and err is not None and beat is not None and control is not None
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        self.watchdog.rewire(beat, control)
        return True

    async def _warm_up(self) -> None:
        """A spare's warm-up (``_warmup.py``): the start, a call, the reply and the stop of an
        actor of otpmesh's own, so that the restart which takes this spare finds those pages
        its own already. Nothing of it stays; a failure is only logged."""
        path = WARMUP_PATH
        # imported here, by name, as an actor's module is
        payload = spawn_request(path, 1, WARMUP_CLASS, name="warmup")
        try:
            started = await self._spawn_actor(None, _codec.unpack(_codec.pack(payload)))
            if started != STARTED:
                log.debug("the spare's warm-up actor did not start: %r", started)
                return
            group = CallGroup([path, path])
            for index, method in enumerate(("echo", "echo_awaiting")):
                self.node.deliver_local(path, method, [index], {}, (group, index))
            await group.wait_all()
            await self.host.stop(path, 1, SHUTDOWN, None, False)
        except Exception:  # pragma: no cover - a spare that cannot warm up still serves
            log.debug("the spare's warm-up failed", exc_info=True)
        finally:
            self.node.exited.pop(path, None)
            self.node.last_exit.pop(path, None)

    async def _spawn_actor(
        self, conn: Connection | None, p: dict[str, Any]
    ) -> str | ActorCrash | Hung:
        # A constructor or on_start that raised answers with its crash (the user's frames only),
        # not as an error of this operation (whose traceback would be otpmesh's).
        try:
            return await self.host.spawn(p)
        except StartFailed as exc:
            return exc.crash

    async def _stop_actor(self, conn: Connection | None, p: dict[str, Any]) -> object:
        return await self.host.stop(
            p["id"],
            p["incarnation"],
            p.get("reason", SHUTDOWN),
            p.get("timeout"),
            p.get("brutal", False),
        )

    async def _inject(self, conn: Connection | None, p: dict[str, Any]) -> bool:
        return self.host.inject(p["id"], p["kind"], p["reason"])

    async def _partition(self, conn: Connection | None, p: dict[str, Any]) -> None:
        self.node.faults.cut_off(float(p["seconds"]))

    async def _shutdown(self, conn: Connection | None, p: Any) -> None:
        with trio.move_on_after(p.get("timeout", 5.0) if isinstance(p, dict) else 5.0):
            async with trio.open_nursery() as nursery:
                for cell in list(self.node.actors.values()):
                    nursery.start_soon(
                        self.host.stop, cell.ctx.path, cell.incarnation, SHUTDOWN, None, False
                    )
        self._done.set()

    def _actor_exiting(self, path: str, incarnation: int) -> None:
        if self.controller is not None and not self.controller.closed:
            self.node.sys_cast(
                self.controller, "actor_exiting", {"id": path, "incarnation": incarnation}
            )

    def _actor_exited(self, path: str, incarnation: int, reason: object) -> None:
        if self.controller is None or self.controller.closed:
            return
        try:
            _codec.pack(reason)
            wire_reason = reason
        except EncodeError:
            wire_reason = repr(reason)  # a reason the wire cannot carry travels as its repr
        self.node.sys_cast(
            self.controller,
            "actor_exited",
            {"id": path, "incarnation": incarnation, "reason": wire_reason},
        )


def main(cfg: dict[str, Any]) -> int:
    """Run a worker until its controller goes away. Called in the forked child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    isolate_worker()  # OTPMESH_DUMPABLE=0: no actor reads another (docs/security.md)
    # A worker stuck in C with the GIL held has no watchdog thread running: its parent sends
    # SIGUSR1 before killing it, and faulthandler writes every thread's stack to its stderr.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from . import _run
    from ._gcpace import pace

    _run.IN_WORKER = True
    pace()  # calls in flight here too: collect less often (_gcpace.py)
    sys.path[:] = cfg["sys_path"]
    os.chdir(cfg["cwd"])
    take_argv(MainModule.from_cfg(cfg))  # before the main file, or any module, reads it
    logging.basicConfig(
        level=cfg.get("log_level", logging.WARNING), format="%(levelname)s %(name)s: %(message)s"
    )
    trio.run(Worker(cfg).main)
    return 0
