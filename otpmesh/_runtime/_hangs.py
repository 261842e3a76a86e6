"""A worker's pipes as the controller watches them: its output forwarded, prefixed with its
actors' paths; its heartbeats; a worker that stopped beating while alive killed, after
faulthandler wrote its stacks when it is stuck in C. ``WatchesPipes`` is that part of
``Runtime`` (_controller_runtime.py; its state is the runtime's)."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from ._forkclient import ForkServer
from ._liveness import HARD_FACTOR
from ._proc import Proc, lines_since
from ._workerpipes import BeatReader, WorkerPipes, forward_lines, watch_heartbeat

log = logging.getLogger("otpmesh.runtime")

#: How long a worker stuck in C has to write its faulthandler dump before it is killed.
FAULTHANDLER_WAIT = 1.0


class WatchesPipes:
    """Each local worker's output, heartbeats and hangs."""

    nursery: trio.Nursery | None
    forkserver: ForkServer
    #: SIGKILL a worker (the runtime's).
    kill: Callable[[Proc], None]

    def watch_pipes(self, proc: Proc, out_r: int, err_r: int, beat_r: int, ctl_w: int) -> None:
        """Forward `proc`'s output and watch its heartbeats, from the parent's pipe ends."""
        assert self.nursery is not None
        proc.pipes = WorkerPipes(beat_r, ctl_w, partial(setattr, proc, "hung"))
        self.nursery.start_soon(forward_lines, out_r, partial(self.output, proc, sys.stdout))
        self.nursery.start_soon(forward_lines, err_r, partial(self.output, proc, sys.stderr))
        self.nursery.start_soon(self._watch_heartbeat, proc, proc.pipes.reader)

    async def _watch_heartbeat(self, proc: Proc, reader: BeatReader) -> None:
        """Kill a worker whose heartbeats stop while it is still alive (stopped, wedged)."""
        await proc.ready.wait()
        await watch_heartbeat(
            reader,
            proc.heartbeat_timeout,
            lambda: proc.alive,
            partial(self.hung, proc),
            lambda: proc.pid,
            lambda: proc.started,
        )

    def hung(self, proc: Proc, why: str) -> None:
        """`proc` stopped beating while alive, stuck (not starved): kill it, and make its exit
        say why. One that is running (in C code holding the GIL: its watchdog thread cannot
        run) is first made to write its threads' stacks with faulthandler (SIGUSR1)."""
        how = f"{why} and was killed"
        log.warning("%s (pid %d) %s", proc.label(), proc.pid, how)
        proc.hang_reason = how
        if proc.host is not None or "stopped" in why or self.nursery is None:
            self.kill(proc)  # a stopped process cannot run a signal handler
            return
        self.nursery.start_soon(self._dump_then_kill, proc, how)

    async def _dump_then_kill(self, proc: Proc, how: str) -> None:
        mark = proc.err_count
        self.forkserver.kill(proc.pid, signal.SIGUSR1)
        # faulthandler writes from its C signal handler, GIL or not; give the lines time to
        # come through the stderr pipe.
        # It ends when no line came for a moment (the dump has no end mark).
        with trio.move_on_after(FAULTHANDLER_WAIT):
            seen = mark
            while proc.alive:
                await trio.sleep(0.1)
                if seen != mark and proc.err_count == seen:
                    break
                seen = proc.err_count
        dump = lines_since(proc, mark)
        proc.hung = {
            "op": "hung",
            "actor": None,  # every actor in it
            "endpoint": "",
            "seconds": proc.heartbeat_timeout * HARD_FACTOR,
            "how": how,
            "stacks": "\n".join(dump),
        }
        self.kill(proc)

    @staticmethod
    def output(proc: Proc, sink: Any, line: bytes) -> None:
        """Write one line of a worker's output to ours, prefixed with its actors' paths."""
        text = line.decode(errors="replace")
        if sink is sys.stderr:
            proc.err_tail.append(text)
            proc.err_count += 1
        try:
            sink.write(f"[{proc.label()}] {text}\n")
            sink.flush()
        except (OSError, ValueError):
            pass
