"""Restarts, measured: from a crash (an exception, a SIGKILL) to the new incarnation's first
reply, for one worker and for a one-for-all group of 4."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import otpmesh

from .actor import BenchActor


async def until_answers(call: Callable[[], Awaitable[Any]]) -> Any:
    """Call until it succeeds (a SIGKILL is noticed asynchronously, a pending call may fail)."""
    while True:
        try:
            return await call()
        except otpmesh.ActorDiedError:
            await trio.sleep(0)


async def after_exception(n: int) -> list[float]:
    """Seconds from an endpoint's exception to the restarted actor's next reply, `n` times."""
    tree = otpmesh.Supervisor("b", intensity=n + 1, children=[otpmesh.Worker("w", BenchActor)])
    samples = []
    async with otpmesh.start(tree) as app:
        ref = app.actor("b/w")
        await ref.echo(0)
        for _ in range(n):
            start = time.perf_counter()
            try:
                await ref.fail()
            except otpmesh.ActorError:
                pass
            await ref.echo(1)  # waits for the new incarnation
            samples.append(time.perf_counter() - start)
    return samples


async def after_sigkill(n: int, spacing: float = 0.0) -> tuple[list[float], list[float]]:
    """Seconds from a SIGKILL to the next reply (the new incarnation's), and to the death
    noticed: its supervisor deciding on the child's exit (the log entry's time). `spacing`:
    seconds between one restart and the next kill (0: back to back, so the next spare is
    mostly still on its way: its fork is asked ``_spare.ASK_AFTER`` after the actor is up)."""
    tree = otpmesh.Supervisor("b", intensity=n + 1, children=[otpmesh.Worker("w", BenchActor)])
    samples, noticed = [], []
    async with otpmesh.start(tree) as app:
        ref = app.actor("b/w")
        for _ in range(n):
            pid, _token = await ref.ident()
            await app.settled()
            exits = len(app.events.of_kind("child_exited"))
            await trio.sleep(spacing)
            start, clock = time.perf_counter(), trio.current_time()
            os.kill(pid, signal.SIGKILL)
            while (await until_answers(ref.ident))[0] == pid:
                await trio.sleep(0)
            samples.append(time.perf_counter() - start)
            noticed.append(app.events.of_kind("child_exited")[exits].time - clock)
    return samples, noticed


async def one_for_all_after_sigkill(n: int) -> list[float]:
    """Seconds from a SIGKILL of one of a one-for-all group of 4 to all 4 answering anew."""
    mesh = otpmesh.Mesh(
        "dp", BenchActor, shape={"procs": 4}, strategy=otpmesh.ONE_FOR_ALL, intensity=n + 1
    )
    tree = otpmesh.Supervisor("b", intensity=n + 1, children=[mesh])
    samples = []
    async with otpmesh.start(tree) as app:
        dp = app.mesh("b/dp")
        for _ in range(n):
            before = (await dp.ident()).values()
            start = time.perf_counter()
            os.kill(before[0][0], signal.SIGKILL)
            while True:
                now = (await until_answers(dp.ident)).values()
                if all(a[1] != b[1] for a, b in zip(now, before, strict=True)):
                    break
                await trio.sleep(0)
            samples.append(time.perf_counter() - start)
    return samples
