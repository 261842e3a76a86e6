"""An actor for tests/test_partial_retry.py (importable by worker processes)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import trio

import otpmesh


class Tally(otpmesh.Actor):
    """Counts the calls its endpoint ran, in the actor and in a journal file that outlives
    incarnations. Rank `victim` blocks in its first `blocks` incarnations' call, after writing
    ``<journal>.held.<n>`` (n = 1, 2, ...), until the test SIGKILLs it."""

    def __init__(self, journal: str, victim: int, blocks: int = 1) -> None:
        self.journal = Path(journal)
        self.victim, self.blocks = victim, blocks
        self.runs = 0

    @otpmesh.endpoint
    async def work(self, x: int) -> dict[str, Any]:
        rank = otpmesh.context().rank
        self.runs += 1
        with self.journal.open("a") as journal:
            journal.write(f"{rank} {os.getpid()}\n")
        if rank == self.victim:
            held = [n for n in range(1, self.blocks + 1) if not self._held(n).exists()]
            if held:
                self._held(held[0]).touch()
                await trio.sleep_forever()  # until SIGKILLed
        return {"rank": rank, "pid": os.getpid(), "value": 10 * x + rank}

    @otpmesh.endpoint
    def ran(self) -> dict[str, int]:
        return {"pid": os.getpid(), "runs": self.runs}

    def _held(self, n: int) -> Path:
        return self.journal.with_name(f"{self.journal.name}.held.{n}")
