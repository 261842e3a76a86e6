"""A host agent's side of a controller takeover (docs/guides/takeover.md, "Across hosts").

A controller run with ``Takeover(..., hosts=...)`` tells each agent, once it registers, its
fencing epoch and grace period (the ``takeover`` cast). From then on, when that controller is
lost (its connection closes, or its heartbeats stop for AGENT_TIMEOUT), the agent keeps its
workers, and their actors' state, for the grace period instead of killing them, and dials the
controllers of its ``--controller`` list in turn, saying what it still runs (a resume HELLO).
It serves the first that presents a higher epoch than the one it served: it fences its workers
(each drops the old controller's connection, which a partition leaves looking open) and hands
its processes over. A controller at the same or a lower epoch is hung up on. Nobody within the
grace period: the workers are killed, as without a takeover (no orphans).
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Protocol

import trio

from .._runtime._watchdog import fence_request

log = logging.getLogger("otpmesh.agent")

#: While the agent waits for a standby, how long one dial of one address may take (a
#: partitioned controller's address would otherwise hold the rotation for DIAL_TIMEOUT).
RESUME_DIAL_TIMEOUT = 1.0
#: The most processes a resume HELLO may say it still runs (a controller keeps that list).
MAX_RESUMED = 4096


def resume_refusal(hello: dict[str, Any]) -> str | None:
    """Why the ``resume`` of an agent's HELLO (hello(), below) may not register (None: it is
    absent, or a map of at most MAX_RESUMED process ids to pids)."""
    resume = hello.get("resume")
    if resume is None:
        return None
    procs = resume.get("procs") if isinstance(resume, dict) else None
    if not isinstance(procs, dict) or len(procs) > MAX_RESUMED:
        return f"its resume is not a map of at most {MAX_RESUMED} processes"
    if not all(type(k) is str and type(v) is int and v > 0 for k, v in procs.items()):
        return "its resume maps a process id to something other than a pid"
    return None


class _Agent(Protocol):
    """What of its agent (_agent.py) this needs: its name, its processes, its connection."""

    name: str
    procs: dict[str, Any]
    conn: Any


class AgentGrace:
    """The takeover state of one agent: the epoch served, the grace, the wait for a standby."""

    def __init__(self, agent: _Agent) -> None:
        self._agent = agent
        #: The epoch of the controller served (0: none with a takeover yet).
        self.epoch = 0
        #: Seconds to keep the workers without a controller (None: no takeover: kill at once).
        self.grace: float | None = None
        #: While waiting for a standby: when the wait ends (trio clock).
        self.deadline: float | None = None
        self._output_dir: str | None = None

    @property
    def waiting(self) -> bool:
        return self.deadline is not None

    def keeps_workers(self) -> bool:
        """The controller is gone: whether to keep the workers (for a standby) for now. Starts
        the grace period the first time; False once it is over (the caller kills them)."""
        if self.grace is None or not self._agent.procs:
            return False
        now = trio.current_time()
        if self.deadline is None:
            self.deadline = now + self.grace
            log.warning(
                "agent %s: controller lost; keeping %d worker(s) for a standby for %g s",
                self._agent.name,
                len(self._agent.procs),
                self.grace,
            )
        if now < self.deadline:
            return True
        self._over()
        return False

    def ran_out(self) -> bool:
        """Registered meanwhile with a standby that has not taken over (it beats, so it is not
        lost): whether the grace period is over all the same. Then the caller kills the
        workers, as the active controller expects by now (HOST_TIMEOUT + grace), and registers
        afresh."""
        if self.deadline is None or trio.current_time() < self.deadline:
            return False
        self._over()
        return True

    def _over(self) -> None:
        log.warning("agent %s: no controller took over within %g s", self._agent.name, self.grace)
        self.grace = self.deadline = None  # the workers go; registration starts afresh

    def hello(self) -> dict[str, Any]:
        """What a HELLO adds while waiting: the epoch served and the processes still running."""
        if not self.waiting:
            return {}
        procs = {p.proc_id: p.pid for p in self._agent.procs.values() if p.alive}
        return {"resume": {"epoch": self.epoch, "procs": procs}}

    def dial_timeout(self, default: float) -> float:
        return RESUME_DIAL_TIMEOUT if self.waiting else default

    def on_takeover(self, payload: Any) -> None:
        """The controller of this session says its epoch and grace (sent right after it
        registered this agent). Waiting for a standby, only a higher epoch is served."""
        agent = self._agent
        epoch = payload.get("epoch") if isinstance(payload, dict) else None
        grace = payload.get("grace") if isinstance(payload, dict) else None
        conn = agent.conn
        if type(epoch) is not int or not isinstance(grace, int | float) or conn is None:
            return
        if epoch <= self.epoch and (self.waiting or epoch < self.epoch):
            log.warning(
                "agent %s: a controller at epoch %d is fenced (this host served %d)",
                agent.name,
                epoch,
                self.epoch,
            )
            conn.abort(f"fenced: this host served epoch {self.epoch}, not above {epoch}")
            return
        if self.waiting:
            for proc in agent.procs.values():  # drop the old controller's connections now
                if proc.alive and proc.pipes is not None and proc.pipes.control_fd >= 0:
                    try:
                        os.write(proc.pipes.control_fd, fence_request(epoch))
                    except OSError:
                        pass
            log.warning("agent %s: taken over at epoch %d", agent.name, epoch)
        self.epoch, self.grace, self.deadline = epoch, float(grace), None

    def worker_cfg(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """A worker's output while no controller is attached goes to a file on this host (the
        controller's state directory need not exist here): in a private directory of ours."""
        takeover = cfg.get("takeover")
        if not isinstance(takeover, dict):
            return cfg
        if self._output_dir is None:
            self._output_dir = tempfile.mkdtemp(prefix="otpmesh-agent-")  # 0700
        output = os.path.join(self._output_dir, f"{cfg.get('proc', 'worker')}.out")
        return dict(cfg, takeover=dict(takeover, output=output))
