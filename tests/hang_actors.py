"""Actors that get stuck in the ways real ones do, for the progress-deadline tests."""

from __future__ import annotations

import time

import trio

import otpmesh


class Stuck(otpmesh.Actor):
    """Each endpoint hangs its own way; `steady` keeps saying it progresses."""

    def __init__(self) -> None:
        self.never = trio.Event()

    @otpmesh.endpoint
    def ping(self) -> str:
        return "pong"

    @otpmesh.endpoint
    def incarnation_pid(self) -> int:
        return otpmesh.context().pid

    @otpmesh.endpoint
    def spin_forever(self) -> None:
        while True:
            pass

    @otpmesh.endpoint
    async def async_spin_forever(self) -> None:
        while True:  # no await: it cannot suspend, so it runs as a plain def would
            pass

    @otpmesh.endpoint
    def sleep_forever(self) -> None:
        time.sleep(3600)

    @otpmesh.endpoint
    async def await_forever(self) -> None:
        await self.never.wait()

    @otpmesh.endpoint
    async def thread_forever(self) -> None:
        await trio.to_thread.run_sync(time.sleep, 3600)  # trio cannot cancel this await

    @otpmesh.endpoint(progress_deadline=0.5)
    def short_fuse(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"

    @otpmesh.endpoint
    def gil_deadlock(self) -> None:
        """Lock a plain mutex twice from C with the GIL held: no Python thread runs again, and
        signals do not interrupt it (a mutex wait is not a syscall that returns EINTR)."""
        import ctypes

        libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held during the call
        mutex = ctypes.create_string_buffer(64)  # zeroed: a default (non-recursive) mutex
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)

    @otpmesh.endpoint
    def boom(self) -> None:
        raise ValueError("bad input")

    @otpmesh.endpoint
    def nap(self, seconds: float) -> str:
        time.sleep(seconds)
        return "rested"

    @otpmesh.endpoint
    def steady(self, steps: int, step: float) -> int:
        for _ in range(steps):
            time.sleep(step)
            otpmesh.progress()
        return steps


class Relayer(otpmesh.Actor):
    """Calls another actor's endpoint from inside its own, and waits for it."""

    @otpmesh.endpoint
    async def forward(self, target: otpmesh.ActorRef, tag: str) -> None:
        await target.wait_forever(tag)
