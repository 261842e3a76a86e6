"""One registered host agent, as the controller sees it (_cluster.py keeps them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._runtime._proc import Proc
from .._wire._connection import Connection
from ._lifeline import Lifeline


@dataclass(eq=False)
class Host:
    """One registered host agent, as the controller sees it."""

    name: str
    rank: int
    host_id: str
    conn: Connection
    last_seen: float
    procs: dict[str, Proc] = field(default_factory=dict)
    dead_reason: str | None = None
    #: Registered to take over: the processes (id -> pid) its agent still ran (_hostover.py).
    resumed: dict[str, int] | None = None
    lifeline: Lifeline | None = None
    lifeline_token: bytes | None = None  # one-time: what its agent's lifeline HELLO presents

    def silent_for(self, now: float) -> float:
        """Seconds since its last beat on either path (`now`: trio's clock, as last_seen)."""
        silent = now - self.last_seen
        return silent if self.lifeline is None else min(silent, self.lifeline.silent_for())

    @property
    def alive(self) -> bool:
        return self.dead_reason is None

    def live_procs(self) -> int:
        return sum(1 for p in self.procs.values() if p.alive)
