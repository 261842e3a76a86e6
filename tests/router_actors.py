"""A router owning engine replicas, as a new user writes it with no error policy at all
(tests/test_default_policy.py; importable by worker processes)."""

from __future__ import annotations

import os
from pathlib import Path

import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, Actor, Mesh, endpoint


class Engine(Actor):
    @endpoint
    async def generate(self, seconds: float, marker: str = "") -> int:
        if marker:
            Path(marker).write_text(str(os.getpid()))  # the request has reached it
        await trio.sleep(seconds)
        return os.getpid()

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class Router(Actor):
    async def on_start(self) -> None:
        spec = Mesh("engines", Engine, shape={"procs": 3}, strategy=ONE_FOR_ONE, intensity=10)
        self.engines = await otpmesh.context().start(spec)

    @endpoint
    async def route(self, replica: int, seconds: float, marker: str = "") -> int:
        return int(await self.engines.mesh()[replica].generate(seconds, marker))

    @endpoint
    async def pids(self) -> list[int]:
        return [os.getpid(), *(await self.engines.mesh().pid()).values()]


class Calc(Actor):
    def __init__(self) -> None:
        self.total = 0

    @endpoint
    async def add(self, x: int) -> int:
        self.total += x
        return self.total


class Streamer(Actor):
    """Streams ``0..n-1`` to a port; the first time, SIGKILLs its own process after
    `die_after` items (once they are on their way), as a replica dies mid-stream."""

    @endpoint
    async def stream(self, n: int, port: otpmesh.Port[int], die_after: int, marker: str) -> int:
        for i in range(n):
            if i == die_after and not os.path.exists(marker):
                Path(marker).touch()
                await trio.sleep(0.2)  # what it sent is out
                os.kill(os.getpid(), 9)
            port.send(i)
        port.close()
        return n
