"""Slots: one actor of a mesh as callers see it: its path, where it lives now, whether it is up.

Slots are shared by a mesh, its slices and its refs, so when the runtime moves an actor (a
restart in a new process) every holder follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import trio

from .._wire._connection import Connection


class WorkerProcess(Protocol):
    """The worker process an actor lives in, as the controller sees it (the runtime's ``Proc``):
    what a slot and its callers ask of it."""

    @property
    def alive(self) -> bool: ...
    @property
    def conn(self) -> Connection | None: ...
    def death(self) -> str:
        """Why it is gone, in words (for callers of its actors)."""
        ...


@dataclass(eq=False, slots=True)
class Slot:
    """One actor of a mesh: its path, where it lives now, and (on the controller) its process.

    A supervised slot outlives incarnations: while its actor restarts the slot is down and calls
    wait for it to come back up; once its supervisor will not restart it, it is gone.
    """

    actor_id: str
    addr: str
    proc: WorkerProcess | None = None
    supervised: bool = False
    remote: bool = False  # a copy received in a message (see Node.resolve)
    up: bool = True
    gone: str | None = None  # why it will not come back
    version: int = 0  # bumped on every change, so a waiter can tell "down and up again"
    _changed: trio.Event | None = None

    def dead_reason(self) -> str | None:
        if self.gone is not None:
            return self.gone
        if self.proc is not None and not self.proc.alive:
            return self.proc.death()
        return None

    def _bump(self) -> None:
        self.version += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def mark_down(self) -> None:
        if self.up:
            self.up = False
            self._bump()

    def mark_up(self, addr: str, proc: WorkerProcess | None) -> None:
        self.addr, self.proc, self.up, self.gone = addr, proc, True, None
        self._bump()

    def mark_gone(self, reason: str) -> None:
        if self.gone != reason or self.up:
            self.up, self.gone = False, reason
            self._bump()

    async def wait_up(self, after: int = -1) -> None:
        """Wait until the slot is up at a version newer than `after`, or gone."""
        while self.supervised and self.gone is None and (not self.up or self.version <= after):
            if self._changed is None:
                self._changed = trio.Event()
            await self._changed.wait()
