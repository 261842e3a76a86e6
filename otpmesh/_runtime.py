"""The controller's runtime: its node, the fork server, and the worker processes it started.

One runtime per trio run (a RunVar, not a process-wide global), created on first use. Its tasks
are trio system tasks: they live as long as the run and are cancelled when it ends, which closes
every socket, so the workers and the fork server notice and exit.
"""

from __future__ import annotations

import array
import importlib.util
import logging
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack
import trio

from ._errors import SpawnError
from ._exits import ProcessExit, describe
from ._node import Node, set_current_node
from ._reasons import is_normal_exit
from ._wire import Connection

log = logging.getLogger("otpmesh.runtime")


class ExitListener(Protocol):
    """Hears of actor exits: first that one is coming, then the exit itself with its reason."""

    def actor_exiting(self, path: str, incarnation: int) -> None: ...
    def actor_exited(self, path: str, incarnation: int, reason: object) -> None: ...
    async def resolve(self, path: str) -> dict[str, Any]: ...


_RUNTIME: trio.lowlevel.RunVar[Runtime] = trio.lowlevel.RunVar("otpmesh_runtime")
_STARTING: trio.lowlevel.RunVar[trio.Event] = trio.lowlevel.RunVar("otpmesh_runtime_starting")
SPAWN_TIMEOUT = 60.0
#: Workers beat this often; one silent for HEARTBEAT_TIMEOUT is hung (SIGSTOP, wedged) and killed.
HEARTBEAT_INTERVAL = float(os.environ.get("OTPMESH_HEARTBEAT_INTERVAL", "0.2"))
HEARTBEAT_TIMEOUT = float(os.environ.get("OTPMESH_HEARTBEAT_TIMEOUT", "2.0"))
# How long a lost connection waits for the fork server's exit status before reporting.
_EXIT_STATUS_WAIT = 1.0


@dataclass(eq=False)
class Proc:
    """One worker process of a proc mesh, as the controller sees it."""

    rank: int
    coords: dict[str, int]
    proc_id: str
    pid: int = 0
    addr: str = ""
    conn: Connection | None = None
    exit_reason: str | None = None
    actors: dict[str, int] = field(default_factory=dict)  # actor path -> incarnation
    names: list[str] = field(default_factory=list)  # every actor path it hosted (output prefix)
    hang_reason: str | None = None  # set when the heartbeat watchdog killed it
    ready: trio.Event = field(default_factory=trio.Event)
    exited: trio.Event = field(default_factory=trio.Event)

    @property
    def alive(self) -> bool:
        return self.exit_reason is None

    def label(self) -> str:
        return ",".join(self.names) if self.names else f"proc/{self.rank}"

    def hosted(self, path: str, incarnation: int) -> None:
        self.actors[path] = incarnation
        self.named(path)

    def named(self, path: str) -> None:
        """Prefix this process's output with `path` (from its constructor's first print on)."""
        if path not in self.names:
            self.names.append(path)

    def death(self) -> str:
        return f"its process (pid {self.pid}) {self.exit_reason or 'is gone'}"


def _preload_modules() -> list[str]:
    configured = os.environ.get("OTPMESH_PRELOAD")
    if configured is not None:
        return [m for m in configured.split(",") if m]
    return ["torch"] if importlib.util.find_spec("torch") is not None else []


class Runtime:
    """Everything the controller owns for one trio run."""

    def __init__(self) -> None:
        self.node = Node("ctl", sys_handlers={"resolve_actor": self._resolve_actor})
        self.node.sys_inline["actor_exited"] = self._actor_exited
        self.node.sys_inline["actor_exiting"] = self._actor_exiting
        self.node.on_hello = self._on_hello
        self.node.on_connection_lost = self._on_connection_lost
        self.procs: dict[str, Proc] = {}
        self._by_pid: dict[int, Proc] = {}
        self._fs_sock: trio.socket.SocketType | None = None
        self._fs_raw: socket.socket | None = None
        self._fs_ready = trio.Event()
        self._fs_gone = False
        self._next_proc = 0
        # Who hears of an actor's exit, by actor path (a supervisor); others are only logged.
        self.exit_listeners: dict[str, ExitListener] = {}
        self._fork_server_started = False
        self.nursery: trio.Nursery | None = None

    # ------------------------------------------------------------ life cycle

    async def _main(self, started: trio.Event) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                await nursery.start(self.node.serve)
                started.set()
        except Exception:
            log.exception("otpmesh runtime failed")
            started.set()

    async def _run_fork_server(self, *, task_status: trio.TaskStatus[None]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env["OTPMESH_FORKSERVER_FD"] = str(theirs.fileno())
        env["OTPMESH_PRELOAD"] = ",".join(_preload_modules())
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "otpmesh._forkserver"],
            pass_fds=(theirs.fileno(),),
            start_new_session=True,  # Ctrl-C reaches the controller only; it stops the rest.
            env=env,
        )
        theirs.close()
        sock = trio.socket.from_stdlib_socket(ours)
        self._fs_sock, self._fs_raw = sock, ours
        task_status.started()
        try:
            while True:
                data = await sock.recv(1 << 16)
                if not data:
                    break
                self._fork_server_report(msgpack.unpackb(data))
        finally:
            self._fs_gone = True
            self._fs_ready.set()
            sock.close()
            with trio.CancelScope(shield=True):
                await process.wait()
            for proc in self.procs.values():
                self._mark_exited(proc, "was killed: the fork server stopped")

    def _fork_server_report(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op == "ready":
            self._fs_ready.set()
        elif op == "spawned":
            proc = self.procs.get(msg["id"])
            if proc is not None:
                proc.pid = msg["pid"]
                self._by_pid[proc.pid] = proc
        elif op == "exit":
            proc = self._by_pid.pop(msg["pid"], None)
            if proc is not None:
                self._mark_exited(proc, msg["reason"])

    def _mark_exited(self, proc: Proc, reason: str) -> None:
        if proc.exit_reason is None:
            proc.exit_reason = proc.hang_reason or reason
        proc.exited.set()
        proc.ready.set()

    # ------------------------------------------------------------ processes

    async def start_procs(
        self, shape: dict[str, int], coords: list[dict[str, int]], envs: list[dict[str, str]]
    ) -> list[Proc]:
        """Fork one worker per slot and wait until each has dialed back (or died)."""
        if not self._fork_server_started and self.nursery is not None:
            # Started on first use: a tree run with placement="local" never needs one.
            self._fork_server_started = True
            await self.nursery.start(self._run_fork_server)
        await self._fs_ready.wait()
        if self._fs_gone:
            raise SpawnError("the otpmesh fork server has stopped; no new workers can start")
        procs = []
        for rank, (point, env) in enumerate(zip(coords, envs, strict=True)):
            self._next_proc += 1
            proc = Proc(rank=rank, coords=point, proc_id=f"p{self._next_proc}")
            self.procs[proc.proc_id] = proc
            procs.append(proc)
            await self._fork(proc, shape, env)
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

    async def _fork(self, proc: Proc, shape: dict[str, int], env: dict[str, str]) -> None:
        assert self._fs_sock is not None and self.nursery is not None
        main = sys.modules.get("__main__")
        cfg = {
            "controller": self.node.addr,
            "proc": proc.proc_id,
            "sys_path": list(sys.path),
            "cwd": os.getcwd(),
            "log_level": logging.getLogger("otpmesh").getEffectiveLevel(),
            "main": getattr(main, "__file__", None),
            "heartbeat_interval": HEARTBEAT_INTERVAL,
        }
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        beat_r, beat_w = os.pipe()
        request = msgpack.packb({"op": "spawn", "id": proc.proc_id, "env": env, "cfg": cfg})
        fds = array.array("i", [out_w, err_w, beat_w])
        try:
            await self._fs_sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        finally:
            os.close(out_w)
            os.close(err_w)
            os.close(beat_w)
        self.nursery.start_soon(self._forward_output, proc, out_r, sys.stdout)
        self.nursery.start_soon(self._forward_output, proc, err_r, sys.stderr)
        self.nursery.start_soon(self._watch_heartbeat, proc, beat_r)

    async def _watch_heartbeat(self, proc: Proc, fd: int) -> None:
        """Kill a worker whose heartbeats stop while it is still alive (stopped, wedged)."""
        stream = trio.lowlevel.FdStream(fd)
        try:
            await proc.ready.wait()
            while proc.alive:
                with trio.move_on_after(HEARTBEAT_TIMEOUT) as silent:
                    if not await stream.receive_some(4096):
                        return  # the process exited: its exit is reported elsewhere
                if silent.cancelled_caught and proc.alive:
                    how = f"hung (no heartbeat for {HEARTBEAT_TIMEOUT:g} s) and was killed"
                    log.warning("%s (pid %d) %s", proc.label(), proc.pid, how)
                    proc.hang_reason = how
                    self.kill(proc)
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _forward_output(self, proc: Proc, fd: int, sink: Any) -> None:
        """Copy a worker's output to ours, each line prefixed with its actors' paths."""
        stream = trio.lowlevel.FdStream(fd)
        pending = b""
        try:
            while True:
                try:
                    data = await stream.receive_some(1 << 16)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    break
                pending = self._write_lines(sink, proc, pending + data)
        finally:
            # The run may be ending: copy what the worker already wrote before closing.
            try:
                while data := os.read(fd, 1 << 16):
                    pending = self._write_lines(sink, proc, pending + data)
            except OSError:
                pass
            if pending:
                self._write_line(sink, proc, pending)
            with trio.CancelScope(shield=True):
                await stream.aclose()

    def _write_lines(self, sink: Any, proc: Proc, data: bytes) -> bytes:
        *lines, rest = data.split(b"\n")
        for line in lines:
            self._write_line(sink, proc, line)
        return rest

    @staticmethod
    def _write_line(sink: Any, proc: Proc, line: bytes) -> None:
        try:
            sink.write(f"[{proc.label()}] {line.decode(errors='replace')}\n")
            sink.flush()
        except (OSError, ValueError):
            pass

    def kill(self, proc: Proc) -> None:
        """SIGKILL a worker (through the fork server, its parent, so the exit is reported)."""
        if proc.pid and proc.alive and self._fs_raw is not None:
            try:
                self._fs_raw.send(msgpack.packb({"op": "kill", "pid": proc.pid}))
            except OSError:
                pass

    # ------------------------------------------------------------ node hooks

    def _on_hello(self, conn: Connection, payload: Any) -> None:
        proc = self.procs.get(str(payload.get("proc"))) if isinstance(payload, dict) else None
        if proc is None or proc.conn is not None:
            log.error("refused a worker hello for an unknown process: %r", payload)
            return
        proc.conn = conn
        proc.addr = payload["addr"]
        proc.pid = proc.pid or payload["pid"]
        self.node.register(proc.addr, conn)
        proc.ready.set()

    def _on_connection_lost(self, conn: Connection) -> bool:
        proc = next((p for p in self.procs.values() if p.conn is conn), None)
        if proc is None or self.nursery is None:
            return False
        self.nursery.start_soon(self._report_death, proc, conn)
        return True

    async def _report_death(self, proc: Proc, conn: Connection) -> None:
        # EOF comes first; the exit status follows from the fork server within milliseconds.
        with trio.move_on_after(_EXIT_STATUS_WAIT):
            await proc.exited.wait()
        if proc.exit_reason is None:
            proc.exit_reason = f"lost its connection ({conn.close_reason})"
        self.node.fail_pending(conn, proc.death())
        actors, proc.actors = proc.actors, {}
        for path, incarnation in actors.items():
            self.actor_exit(path, incarnation, ProcessExit(proc.pid, proc.exit_reason))

    async def _resolve_actor(self, conn: Connection | None, path: str) -> dict[str, Any]:
        listener = self.exit_listeners.get(path)
        if listener is None:
            return {"gone": f"{path} is not supervised by a running application"}
        return await listener.resolve(path)

    def _actor_exiting(self, payload: dict[str, Any]) -> None:
        listener = self.exit_listeners.get(payload["id"])
        if listener is not None:
            listener.actor_exiting(payload["id"], payload["incarnation"])

    def _actor_exited(self, payload: dict[str, Any]) -> None:
        # Inline in the connection reader: the exit is known before any later "dead" reply.
        path, incarnation = payload["id"], payload["incarnation"]
        for proc in self.procs.values():
            if proc.actors.get(path) == incarnation:
                del proc.actors[path]
        self.actor_exit(path, incarnation, payload["reason"])

    def actor_exit(self, path: str, incarnation: int, reason: object) -> None:
        listener = self.exit_listeners.get(path)
        if listener is not None:
            listener.actor_exited(path, incarnation, reason)
        elif not is_normal_exit(reason):
            log.warning("%s exited: %s", path, describe(reason))


async def runtime() -> Runtime:
    """The controller runtime of the current trio run, started on first use."""
    try:
        return _RUNTIME.get()
    except LookupError:
        pass
    try:
        starting = _STARTING.get()
    except LookupError:
        starting = trio.Event()
        _STARTING.set(starting)
        rt = Runtime()
        trio.lowlevel.spawn_system_task(rt._main, starting, name="otpmesh-runtime")
        await starting.wait()
        if rt.nursery is None:
            raise SpawnError("the otpmesh runtime failed to start (see the log above)") from None
        _RUNTIME.set(rt)
        set_current_node(rt.node)
        return rt
    await starting.wait()
    return _RUNTIME.get()
