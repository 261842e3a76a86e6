"""Actors whose start never ends, for tests/test_start_deadline.py (workers import them)."""

from __future__ import annotations

import os
import time

import trio

import otpmesh


class SleepsInInit(otpmesh.Actor):
    """A constructor stuck in ``time.sleep``: its heartbeat thread beats on regardless."""

    def __init__(self) -> None:
        time.sleep(3600)


class ProgressesForEver(otpmesh.Actor):
    """A constructor that says it moves, and never ends: only the start timeout stops it."""

    def __init__(self) -> None:
        while True:
            otpmesh.progress()
            time.sleep(0.05)


class HangsOnceInOnStart(otpmesh.Actor):
    """Its ``on_start`` hangs once when the file `marker` exists (and takes it away)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    async def on_start(self) -> None:
        if os.path.exists(self.marker):
            os.unlink(self.marker)
            await trio.sleep(3600)

    @otpmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @otpmesh.endpoint
    async def crash(self) -> None:
        raise RuntimeError("crashed on purpose")


class Pid(otpmesh.Actor):
    @otpmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()
