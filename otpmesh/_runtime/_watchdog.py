"""A worker's watchdog thread: heartbeats, progress deadlines, and stacks on request.

It runs beside the event loop, so it keeps working while the loop is blocked in a plain-def
endpoint (it needs only the GIL, which Python code gives up every few milliseconds):

- it writes a beat (``b"."``) to the beat pipe every interval (the parent's liveness check,
  _liveness.py, hears them);
- it reads requests from the control pipe (``b"s"`` and a sequence number: send the stacks of
  every actor);
- it watches the calls each actor serves (``ActorCell.servings()``: the serial one, and those
  of concurrent endpoints in flight, each with its own deadline): one that made no progress
  for its deadline is hung. For an async endpoint the loop is asked to crash the actor with a
  ``Hung`` reason (the endpoint is cancelled, ``on_stop`` runs, the exit is reported as usual).
  A plain-def endpoint blocks the loop itself (or, ``blocking=True``, a thread the loop cannot
  stop), as does an async one the loop does not get back from within ``GRACE``: the watchdog
  reports the hang on the beat pipe and kills its own process with SIGKILL, without asking the
  loop to crash the actor first (an exit the loop reported would be restarted in this process,
  just before the kill). The parent reads the report before it reports the exit, so the actor's
  exit reason is the ``Hung``, with the stacks.

Reports on the beat pipe are ``b"!"``, a 4-byte big-endian length and a msgpack map; the
watchdog is the pipe's only writer, so beats and reports never interleave. ``BeatReader`` (the
parent's side) is in _workerpipes.py.
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import struct
import threading
import time
from typing import Any

import msgpack
import trio

from .._core._exits import Hung
from . import _stacks

log = logging.getLogger("otpmesh.worker")

#: How long the event loop has to crash a hung async endpoint's actor itself before the
#: process is killed (a plain-def endpoint blocks the loop: its process is killed at once).
GRACE = 0.3
#: Reports longer than this are cut (a stack dump of many threads).
MAX_REPORT = 256 * 1024
REPORT = b"!"
BEAT = b"."
STACKS_REQUEST = b"s"
#: From a host agent that took a controller at a newer epoch (the 4 bytes): drop the old one.
FENCE_REQUEST = b"f"
#: A request on the control pipe: its kind (one byte) and a 4-byte big-endian sequence number,
#: echoed in the answer so a late answer is never taken for a newer request's.
REQUEST_SIZE = 5


def stacks_request(seq: int) -> bytes:
    return STACKS_REQUEST + struct.pack(">I", seq & 0xFFFFFFFF)


def fence_request(epoch: int) -> bytes:
    return FENCE_REQUEST + struct.pack(">I", epoch & 0xFFFFFFFF)


def frame_report(msg: dict[str, Any]) -> bytes:
    """One report as it travels on the beat pipe, its texts cut to fit MAX_REPORT bytes."""
    body: bytes = msgpack.packb(msg)
    budget = MAX_REPORT // 2
    while len(body) > MAX_REPORT and budget > 64:
        budget //= 2
        msg = _cut_texts(msg, budget)
        body = msgpack.packb(msg)
    return REPORT + struct.pack(">I", len(body)) + body


def _cut_texts(value: Any, chars: int) -> Any:
    if isinstance(value, str):
        return _cut(value, chars)
    if isinstance(value, dict):
        return {k: _cut_texts(v, chars) for k, v in value.items()}
    return value


def _cut(text: str, chars: int = MAX_REPORT // 4) -> str:
    return text if len(text) <= chars else text[:chars] + "\n  ... (cut)"


def hung_reason(report: dict[str, Any]) -> Hung:
    """The exit reason a "hung" report stands for."""
    return Hung(
        str(report.get("endpoint", "")),
        float(report.get("seconds", 0.0)),
        str(report.get("how", "")),
        str(report.get("stacks", "")),
    )


class Watchdog:
    """The thread; `cells()` gives the node's actor cells (path -> cell) when called."""

    def __init__(
        self,
        cells: Any,
        *,
        starts: Any = None,
        beat_fd: int | None,
        control_fd: int | None,
        interval: float,
        token: trio.lowlevel.TrioToken,
        may_kill: bool = True,
        on_fence: Any = None,
    ) -> None:
        self._cells = cells
        # The actors being started (path -> _node/_serving.py's Starting), when called.
        self._starts = starts or dict
        # A host agent that took a newer controller tells its worker to drop the old one's
        # connection (_agentgrace.py): called with that epoch, on the trio thread.
        self._on_fence = on_fence
        self._beat_fd = beat_fd
        self._control_fd = control_fd
        self._interval = interval
        self._token = token
        # A worker may end its own process; the controller (placement="local") may not.
        self._may_kill = may_kill
        self._requests = b""
        self._stopped = threading.Event()

    def rewire(self, beat_fd: int, control_fd: int) -> None:
        """Beat to and take requests from a new parent (a controller that took this worker
        over). The old descriptors stay open: the thread may be waiting on them right now."""
        self._requests = b""
        self._control_fd = control_fd
        self._beat_fd = beat_fd

    def start(self) -> Watchdog:
        threading.Thread(target=self._run, name="otpmesh-watchdog", daemon=True).start()
        return self

    def stop(self) -> None:
        """End the thread (a worker's ends with its process)."""
        self._stopped.set()

    def _run(self) -> None:
        next_beat = 0.0
        try:
            while not self._stopped.is_set():
                now = time.monotonic()
                if now >= next_beat:
                    self._write(BEAT)
                    next_beat = now + self._interval
                wait = max(0.0, min(next_beat, self._next_expiry()) - now)
                if self._control_fd is not None:
                    ready, _, _ = select.select([self._control_fd], [], [], wait)
                    if ready:
                        self._serve_request(os.read(self._control_fd, 64))
                else:
                    self._stopped.wait(wait)
                self._check(time.monotonic())
        except OSError:
            return  # the parent is gone: the process follows its connection

    def _write(self, data: bytes) -> None:
        if self._beat_fd is None:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._beat_fd, view) :]
        except BrokenPipeError:
            # Its parent is gone. Without a takeover the process follows at once; with one, it
            # waits for a standby, and its actors' progress deadlines still count meanwhile.
            self._beat_fd = None

    def _serve_request(self, data: bytes) -> None:
        if not data:
            self._control_fd = None  # the parent closed it; beat on until the process ends
            return
        self._requests += data
        seq = None
        while len(self._requests) >= REQUEST_SIZE:
            request, self._requests = (
                self._requests[:REQUEST_SIZE],
                self._requests[REQUEST_SIZE:],
            )
            if request[:1] == STACKS_REQUEST:
                (seq,) = struct.unpack(">I", request[1:])
            elif request[:1] == FENCE_REQUEST and self._on_fence is not None:
                (epoch,) = struct.unpack(">I", request[1:])
                try:
                    trio.from_thread.run_sync(self._on_fence, epoch, trio_token=self._token)
                except trio.RunFinishedError:
                    pass
        if seq is not None:  # one answer, to the newest request, serves those before it
            snapshot = _stacks.snapshot(dict(self._cells()), skip_threads=[threading.get_ident()])
            snapshot["actors"] = {p: _cut(t) for p, t in snapshot["actors"].items()}
            snapshot["threads"] = _cut(snapshot["threads"])
            self._write(frame_report({"op": "stacks", "seq": seq, **snapshot}))

    def _next_expiry(self) -> float:
        expiry = math.inf
        for start in list(self._starts().values()):
            if not start.hung:
                expiry = min(expiry, start.expiry())
        for cell in list(self._cells().values()):
            for serving in cell.servings():
                if serving.deadline is not None and not serving.hung:
                    expiry = min(expiry, serving.progress_at + serving.deadline)
        return expiry

    def _check(self, now: float) -> None:
        for start in list(self._starts().values()):
            if not start.hung and not start.done and now >= start.expiry():
                start.hung = True
                self._start_hung(start, now)
        for cell in list(self._cells().values()):
            for serving in cell.servings():  # each call in flight has its own deadline
                if (
                    serving.deadline is None
                    or serving.hung
                    or now - serving.progress_at <= serving.deadline
                ):
                    continue
                serving.hung = True
                self._hung(cell, serving)
                break  # the actor exits: one reason is enough

    @staticmethod
    def _ended(cell: Any, serving: Any, within: float) -> bool:
        """Whether `cell` stopped serving `serving` within `within` seconds."""
        deadline = time.monotonic() + within
        while cell.serves(serving) and not cell.exited:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _start_hung(self, start: Any, now: float) -> None:
        """A constructor, ``on_start`` or heal past its deadline: an async one is cancelled by
        the loop, and the start fails with the ``Hung``; one that holds the loop ends with its
        process, as a plain-def endpoint does."""
        serving = start.serving
        seconds, how = start.why(now)
        stacks = _stacks.actor_stack(start, serving)
        others = _stacks.thread_stacks(skip=[threading.get_ident()])
        text = _cut(f"{stacks}\n{others}" if others else stacks)
        reason = Hung("__init__", round(seconds, 3), how, text)
        log.error("%s: %s", start.path, reason)
        if serving.is_async or not self._may_kill:
            cancelled = threading.Event()

            def cancel() -> None:
                start.cancel(reason)
                cancelled.set()

            try:
                self._token.run_sync_soon(cancel)
            except trio.RunFinishedError:
                return
            if not self._may_kill or (cancelled.wait(GRACE) and self._start_ended(start)):
                return  # the start fails with the reason, its process serves on
        report = {"op": "hung", "actor": start.path, "incarnation": start.incarnation}
        report.update(endpoint="__init__", seconds=reason.seconds, stacks=text)
        report["how"] = f"{how}; its process was killed"
        self._write(frame_report(report))
        os.kill(os.getpid(), signal.SIGKILL)

    @staticmethod
    def _start_ended(start: Any) -> bool:
        deadline = time.monotonic() + GRACE
        while not start.done:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _hung(self, cell: Any, serving: Any) -> None:
        stacks = _stacks.actor_stack(cell, serving)
        others = _stacks.thread_stacks(skip=[threading.get_ident()])
        text = _cut(f"{stacks}\n{others}" if others else stacks)
        path = cell.ctx.path
        reason = Hung(serving.method, serving.deadline, "ran past its progress deadline", text)
        log.error("%s: %s", path, reason)
        # A plain-def endpoint (on the loop's thread, or a blocking one in a thread of its own)
        # ends with its process, killed below: the loop is not asked to crash the actor first.
        # A blocking endpoint leaves the loop free, and a crash the loop ran before the kill
        # landed reported the actor's exit, so its supervisor restarted it in this process,
        # and the kill took the new incarnation too (a second exit for one hang).
        if serving.is_async or not self._may_kill:
            crashed = threading.Event()

            def crash() -> None:
                if cell.serves(serving):
                    cell.crash(reason)
                crashed.set()

            try:
                self._token.run_sync_soon(crash)
            except trio.RunFinishedError:
                return
            # An async endpoint is cancelled by the loop, unless the cancellation cannot reach
            # it (it awaits a thread stuck in C): then it still serves after the grace, and is
            # treated as a blocked one.
            if crashed.wait(GRACE) and (not self._may_kill or self._ended(cell, serving, GRACE)):
                return  # the actor exits with the reason like any crash
        if not self._may_kill:
            # The controller's own loop is blocked in the endpoint: the crash waits its turn
            # (queued above) and happens when the endpoint returns.
            log.error("%s cannot be stopped until its endpoint returns", path)
            return
        # The loop is blocked in the endpoint itself: say why, then end the process.
        report = {"op": "hung", "actor": path, "incarnation": cell.incarnation}
        report.update(endpoint=reason.endpoint, seconds=reason.seconds, how=reason.how, stacks=text)
        report["how"] = "ran past its progress deadline; its process was killed"
        self._write(frame_report(report))
        os.kill(os.getpid(), signal.SIGKILL)
