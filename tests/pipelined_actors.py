"""An actor for tests/test_pipelining.py (importable by worker processes)."""

from __future__ import annotations

import os
import uuid

import otpmesh


class Ledger(otpmesh.Actor):
    """Numbers the calls it serves, per incarnation, and keeps which call each one was."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex  # tells incarnations apart
        self.served: list[int] = []

    @otpmesh.endpoint
    async def note(self, seq: int) -> tuple[str, int]:
        # Async, as the benchmark's echo: such calls go through the mailbox (never inline).
        self.served.append(seq)
        return self.token, len(self.served) - 1

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @otpmesh.endpoint
    def ledger(self) -> tuple[str, list[int]]:
        return self.token, self.served
