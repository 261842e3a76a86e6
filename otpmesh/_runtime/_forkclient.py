"""The client side of the fork server (_forkserver.py): start it, ask it to fork, hear its reports.

The controller runs one for the processes of its own host; a host agent (_agent.py) runs one for
the processes of its host. Both read a worker's output and heartbeats from pipes this module makes.
"""

from __future__ import annotations

import array
import contextlib
import importlib.util
import logging
import os
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

import msgpack
import trio

from .._core._sandbox import warning_once
from .._wire._unproven import parent_pid
from . import _liveness
from ._forkstandby import dial_standby
from ._watchdog import MAX_REPORT, REPORT, stacks_request

log = logging.getLogger("otpmesh.forkserver")


def preload_modules() -> list[str]:
    """What the fork server imports before it forks (torch, when installed)."""
    configured = os.environ.get("OTPMESH_PRELOAD")
    if configured is not None:
        return [m for m in configured.split(",") if m]
    return ["torch"] if importlib.util.find_spec("torch") is not None else []


class ForkServer:
    """A running fork server. ``await nursery.start(fs.run)``, then ``spawn`` and ``kill``.

    `on_report` hears its reports: ``{"op": "spawned", "id", "pid"}`` and
    ``{"op": "exit", "pid", "reason"}``; `on_gone` is called once when it stops. A "spawned"
    report also carries the child's death lock page (_deathlock.py) as ``"page"``, a descriptor
    `on_report` takes by popping it (one left in the report is closed after it).
    """

    def __init__(
        self, on_report: Callable[[dict[str, Any]], None], on_gone: Callable[[], None]
    ) -> None:
        self._on_report = on_report
        self._on_gone = on_gone
        self._sock: trio.socket.SocketType | None = None
        self._raw: socket.socket | None = None
        self.ready = trio.Event()
        self.gone = False
        #: The fork server's pid once it runs (its children are the workers).
        self.pid: int | None = None

    def forked(self, pid: int) -> bool:
        """Whether `pid` is a child of this fork server (the kernel's word, read from /proc):
        one of its workers, known before the server's report of it arrives."""
        return self.pid is not None and parent_pid(pid) == self.pid

    async def run(
        self,
        standby: dict[str, Any] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start the fork server, hear its reports until it stops. With `standby` (_forkstandby.py)
        it outlives this controller for the grace period, for a standby to attach."""
        unconfined = warning_once()  # the workers it forks, said once (_core/_sandbox.py)
        if unconfined is not None:
            log.warning("%s", unconfined)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env["OTPMESH_FORKSERVER_FD"] = str(theirs.fileno())
        env["OTPMESH_PRELOAD"] = ",".join(preload_modules())
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "otpmesh._runtime._forkserver"],
            pass_fds=(theirs.fileno(),),
            start_new_session=True,  # Ctrl-C reaches the controller only; it stops the rest.
            env=env,
        )
        theirs.close()
        self.pid = process.pid
        if standby is not None:  # over the private socket pair: the secret never leaves it
            ours.send(msgpack.packb({"op": "takeover", **standby}))
        try:
            await self._serve(ours, task_status)
        finally:
            with trio.CancelScope(shield=True):
                await process.wait()
            self._on_gone()

    async def attach(
        self,
        path: str,
        secret: bytes,
        epoch: int,
        *,
        task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Take over the fork server at `path` at `epoch` (FencedError, OSError: dial_standby),
        then hear its reports until it stops; started with its live children's pids."""
        raw, reply = await dial_standby(path, secret, epoch)
        self.pid = int(reply["pid"])
        self.ready.set()
        try:
            await self._serve(raw, task_status, reply["children"])
        finally:
            self._on_gone()

    async def _serve(
        self, raw: socket.socket, task_status: trio.TaskStatus[Any], started: Any = None
    ) -> None:
        sock = trio.socket.from_stdlib_socket(raw)
        self._sock, self._raw = sock, raw
        task_status.started(started)
        try:
            while True:
                data, fds = await _recv_report(sock)
                if not data:
                    break
                msg = msgpack.unpackb(data)
                if msg["op"] == "ready":
                    self.ready.set()
                    continue
                if msg["op"] == "spawned" and fds:
                    msg["page"] = fds.pop()
                try:
                    self._on_report(msg)
                finally:
                    for fd in [*fds, *([msg["page"]] if "page" in msg else [])]:
                        os.close(fd)
        finally:
            self.gone = True
            self.ready.set()
            sock.close()

    def detach(self) -> None:
        """Let go of the fork server as a controller that dies does: with a takeover set up it
        waits out its grace period for a standby, its children running on."""
        if self._raw is not None and not self.gone:
            with contextlib.suppress(OSError):
                self._raw.shutdown(socket.SHUT_RDWR)

    def quit(self) -> None:
        """Ask the fork server to stop now (its controller is stopping in order: no takeover)."""
        if self._raw is not None and not self.gone:
            with contextlib.suppress(OSError):
                self._raw.send(msgpack.packb({"op": "quit"}))

    async def spawn(
        self, proc_id: str, env: dict[str, str], cfg: dict[str, Any]
    ) -> tuple[int, int, int, int]:
        """Fork a worker; return the read ends of its stdout, stderr and beat pipes, and the
        write end of its control pipe (_watchdog.py)."""
        assert self._sock is not None
        (out_r, err_r, beat_r, ctl_w), (out_w, err_w, beat_w, ctl_r) = worker_pipes()
        request = msgpack.packb({"op": "spawn", "id": proc_id, "env": env, "cfg": cfg})
        fds = array.array("i", [out_w, err_w, beat_w, ctl_r])
        try:
            await self._sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except BaseException:
            for fd in (out_r, err_r, beat_r, ctl_w):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, beat_w, ctl_r):
                os.close(fd)
        return out_r, err_r, beat_r, ctl_w

    def want_spare(self, cfg: dict[str, Any] | None) -> None:
        """Ask for a spare worker started from `cfg`, the app's part of a worker config
        (_spare.py); one the server has for it already is kept. None: no spare."""
        if self._raw is not None and not self.gone:
            try:
                self._raw.send(msgpack.packb({"op": "spare", "cfg": cfg}))
            except OSError:
                pass

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """Signal a worker (SIGKILL: the fork server, its parent, then reports the exit)."""
        if pid and self._raw is not None and not self.gone:
            try:
                self._raw.send(msgpack.packb({"op": "kill", "pid": pid, "sig": int(sig)}))
            except OSError:
                pass


async def _recv_report(sock: trio.socket.SocketType) -> tuple[bytes, list[int]]:
    """One report of the fork server, and the descriptors it came with (at most one)."""
    data, ancillary, _flags, _addr = await sock.recvmsg(
        1 << 16, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC
    )
    fds = array.array("i")
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
    return data, list(fds)


def worker_pipes() -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """A worker's stdout, stderr, beat and control pipes: the parent's ends (stdout, stderr and
    beat read ends, control write end), then the worker's (the other four)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    beat_r, beat_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    os.set_blocking(ctl_w, False)
    os.set_blocking(beat_r, False)  # drained by BeatReader.drain() on the event loop
    return (out_r, err_r, beat_r, ctl_w), (out_w, err_w, beat_w, ctl_r)


class BeatReader:
    """The parent's end of a worker's beat pipe: beats, and the watchdog's reports
    (_watchdog.py), each handed to `on_report` once, whoever reads it first: the heartbeat
    watcher, or ``drain()`` when the worker's exit is being reported."""

    def __init__(self, fd: int, on_report: Callable[[dict[str, Any]], None]) -> None:
        self.fd = fd
        self._on_report = on_report
        self._pending = b""
        self._skip = 0  # bytes of an oversized report still to pass over

    def feed(self, data: bytes) -> None:
        if self._skip:
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            data = data[skipped:]
        buf = self._pending + data
        i = 0
        while i < len(buf):
            if buf[i : i + 1] != REPORT:
                i += 1  # a beat
                continue
            if len(buf) - i < 5:
                break
            (size,) = struct.unpack(">I", buf[i + 1 : i + 5])
            if size > MAX_REPORT:  # not one of ours: pass over exactly it
                remaining = len(buf) - i - 5
                if remaining >= size:
                    i += 5 + size
                    continue
                self._skip = size - remaining
                i = len(buf)
                break
            if len(buf) - i - 5 < size:
                break
            try:
                msg = msgpack.unpackb(buf[i + 5 : i + 5 + size])
            except ValueError:
                msg = None
            i += 5 + size
            if isinstance(msg, dict):
                self._on_report(msg)
        self._pending = buf[i:]

    def drain(self) -> None:
        """Read what the worker already wrote (it may have just died)."""
        if self.fd < 0:
            return  # closed: the watcher read everything up to the end
        try:
            while data := os.read(self.fd, 1 << 16):
                self.feed(data)
        except OSError:
            pass


class _Asked:
    __slots__ = ("answer", "done", "seq")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.done = trio.Event()
        self.answer: dict[str, Any] | str = ""


class StackRequests:
    """Stacks asked of one worker's watchdog: callers asking at once share one request; an
    answer counts only for the request whose sequence number it carries."""

    def __init__(self) -> None:
        self._asked: _Asked | None = None
        self._seq = 0

    async def ask(self, send: Callable[[bytes], object], timeout: float) -> dict[str, Any] | str:
        """Send the request (unless one is out) and wait up to `timeout` for its answer; a str
        says why there is none."""
        asked = self._asked
        if asked is None:
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            asked = self._asked = _Asked(self._seq)
            try:
                send(stacks_request(asked.seq))
            except OSError as exc:
                self._asked = None
                return f"cannot be asked ({exc.strerror})"
        with trio.move_on_after(timeout):
            await asked.done.wait()
        if not asked.done.is_set():
            if self._asked is asked:
                self._asked = None
            return f"no answer within {timeout:g} s (stopped, or in C code holding the GIL)"
        return asked.answer

    def answer(self, msg: dict[str, Any]) -> None:
        asked = self._asked
        if asked is not None and msg.get("seq") == asked.seq:
            self._asked = None
            asked.answer = msg
            asked.done.set()

    def fail(self, why: str) -> None:
        asked, self._asked = self._asked, None
        if asked is not None:
            asked.answer = why
            asked.done.set()


class WorkerPipes:
    """The parent's ends of one worker's beat and control pipes (_watchdog.py): a hang it
    reports goes to `on_hung`; ``ask_stacks`` asks it what its actors are doing."""

    def __init__(
        self, beat_fd: int, control_fd: int, on_hung: Callable[[dict[str, Any]], None]
    ) -> None:
        self.reader = BeatReader(beat_fd, self._report)
        self.control_fd = control_fd
        self._on_hung = on_hung
        self._stacks = StackRequests()

    def _report(self, msg: dict[str, Any]) -> None:
        if msg.get("op") == "hung":
            self._on_hung(msg)
        elif msg.get("op") == "stacks":
            self._stacks.answer(msg)

    async def ask_stacks(self, timeout: float) -> dict[str, Any] | str:
        """Its watchdog's answer (even while its event loop is blocked), or why there is none."""
        fd = self.control_fd
        if fd < 0:
            return "its process is gone"
        return await self._stacks.ask(lambda request: os.write(fd, request), timeout)

    def close(self, why: str) -> None:
        """The worker exited: read what it wrote last (a hang report comes before its exit),
        close its control pipe, and answer a stacks request still out with `why`."""
        self.reader.drain()
        if self.control_fd >= 0:
            os.close(self.control_fd)
            self.control_fd = -1
        self._stacks.fail(why)


async def watch_heartbeat(
    reader: BeatReader,
    timeout: float,
    alive: Callable[[], bool],
    on_hung: Callable[[str], None],
    pid: Callable[[], int],
    started: Callable[[], bool] = lambda: True,
) -> None:
    """Call `on_hung(reason)` when a live worker's heartbeats stop and the kernel says it is
    stuck, not starved (_liveness.py): stopped, at `timeout` of silence; running or sleeping
    without a beat, at HARD_FACTOR times that, or at the start's own deadline until it is
    `started`. Reports on the pipe go to the reader's hook."""
    fd = reader.fd
    stream = trio.lowlevel.FdStream(fd)  # makes `fd` non-blocking; closes it at the end
    try:
        last = trio.current_time()
        answered = started()
        while alive():
            wait = last + timeout - trio.current_time()
            # One cancel scope per silence, its deadline moved on by each beat, not one per
            # beat: with a thousand workers the controller wakes thousands of times a second
            # for beats, and a scope per wake-up was a third of what each cost.
            with trio.move_on_after(wait if wait > 0 else timeout / 4) as silent:
                while True:
                    await trio.lowlevel.wait_readable(fd)
                    try:
                        data = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if not data:
                        return  # the process exited: its exit is reported elsewhere
                    reader.feed(data)
                    last = trio.current_time()
                    silent.deadline = last + timeout
            if not alive():
                continue
            if _liveness.pending_beats(fd, reader.feed):  # this watcher was the late one
                last = trio.current_time()
                continue
            if not answered and started():
                # Its start was answered: it lives, as a beat would say. Its silence is judged
                # from here (a start that held the GIL for seconds had sent no beat since).
                answered = True
                last = trio.current_time()
                continue
            reason = _liveness.verdict(
                _liveness.proc_state(pid()), trio.current_time() - last, timeout, started()
            )
            if reason is not None:
                on_hung(reason)
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        return
    finally:
        reader.drain()
        reader.fd = -1
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def forward_lines(fd: int, write_line: Callable[[bytes], None]) -> None:
    """Call `write_line` for each line the worker writes to `fd`, until it closes it."""
    stream = trio.lowlevel.FdStream(fd)
    pending = b""
    data = b""
    try:
        while True:
            try:
                data = await stream.receive_some(1 << 16)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                break
            pending = _split(pending + data, write_line)
    finally:
        # The run may be ending: copy what the worker already wrote before closing.
        try:
            while data := os.read(fd, 1 << 16):
                pending = _split(pending + data, write_line)
        except OSError:
            pass
        if pending:
            write_line(pending)
        with trio.CancelScope(shield=True):
            await stream.aclose()


def _split(data: bytes, write_line: Callable[[bytes], None]) -> bytes:
    *lines, rest = data.split(b"\n")
    for line in lines:
        write_line(line)
    return rest
