"""An actor for tests/test_pipelining.py (importable by worker processes)."""

from __future__ import annotations

import os
import signal
import uuid

import otpmesh


class Ledger(otpmesh.Actor):
    """Numbers the calls it serves, per incarnation, and writes each one to a journal file
    that outlives its process (one write per call, straight to the kernel: a SIGKILL loses
    none)."""

    def __init__(self, journal: str, kill_after: int | None = None) -> None:
        self.token = uuid.uuid4().hex  # tells incarnations apart
        self.served = 0
        self.journal = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        # The first incarnation SIGKILLs its own process as it serves call number
        # `kill_after` (after journaling it, before replying): a kill at a known step.
        self.kill_after = kill_after
        self.marker = f"{journal}.killed"

    @otpmesh.endpoint
    async def note(self, seq: int) -> tuple[str, int]:
        # Async, as the benchmark's echo: such calls go through the mailbox (never inline).
        return self._note(seq)

    def _note(self, seq: int) -> tuple[str, int]:
        os.write(self.journal, f"{self.token} {seq}\n".encode())
        self.served += 1
        if self.served - 1 == self.kill_after and _first_time(self.marker):
            os.kill(os.getpid(), signal.SIGKILL)
        return self.token, self.served - 1

    @otpmesh.endpoint
    async def note_or_crash(self, seq: int, crash_at: int) -> tuple[str, int]:
        """`note`, except that call `crash_at` crashes the actor (an exception: it restarts
        in its live process, and the calls still in its mailbox were never delivered)."""
        if seq == crash_at:
            raise RuntimeError(f"crash at call {seq}")
        return self._note(seq)

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


def _first_time(marker: str) -> bool:
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True
