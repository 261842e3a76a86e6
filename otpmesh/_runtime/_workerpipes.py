"""A worker's pipes as its parent reads them (made here, handed to the fork server): its output
forwarded line by line, its heartbeats watched (``watch_heartbeat``, judged by _liveness.py), the
watchdog's reports read (``BeatReader``, _watchdog.py), and its stacks asked for (``WorkerPipes``).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import trio

from . import _liveness
from ._watchdog import MAX_REPORT, REPORT, stacks_request


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
