"""An actor for tests/test_pipelining.py (importable by worker processes)."""

from __future__ import annotations

import os
import uuid

import otpmesh


class Ledger(otpmesh.Actor):
    """Numbers the calls it serves, per incarnation, and writes each one to a journal file
    that outlives its process (one write per call, straight to the kernel: a SIGKILL loses
    none)."""

    def __init__(self, journal: str) -> None:
        self.token = uuid.uuid4().hex  # tells incarnations apart
        self.served = 0
        self.journal = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    @otpmesh.endpoint
    async def note(self, seq: int) -> tuple[str, int]:
        # Async, as the benchmark's echo: such calls go through the mailbox (never inline).
        os.write(self.journal, f"{self.token} {seq}\n".encode())
        self.served += 1
        return self.token, self.served - 1

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()
