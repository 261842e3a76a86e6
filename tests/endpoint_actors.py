"""Actors of the endpoint-kind tests: concurrent, blocking, and error-policy endpoints
(importable by worker processes)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import trio

import otpmesh


class Gather(otpmesh.Actor):
    """Concurrent calls that each wait for the last one to arrive: served serially, the
    first would wait for ever."""

    def __init__(self) -> None:
        self.arrived = 0
        self.all_here = trio.Event()
        self.started: list[int] = []

    @otpmesh.endpoint(concurrent=True)
    async def meet(self, i: int, n: int) -> int:
        self.started.append(i)
        self.arrived += 1
        if self.arrived == n:
            self.all_here.set()
        await self.all_here.wait()
        return i

    @otpmesh.endpoint(concurrent=True)
    async def hold(self) -> None:
        """In flight until cancelled or killed."""
        self.arrived += 1
        await trio.sleep_forever()

    @otpmesh.endpoint(concurrent=True)
    async def boom(self) -> None:
        raise ValueError("boom in a concurrent call")

    @otpmesh.endpoint(concurrent=2)
    async def pair(self, i: int) -> int:
        """At most two in flight: the third waits in the mailbox until one ends."""
        self.arrived += 1
        if self.arrived == 2:
            self.all_here.set()
        await self.all_here.wait()
        return i

    @otpmesh.endpoint
    def in_flight(self) -> int:
        """A serial endpoint: answered while concurrent calls wait."""
        return self.arrived

    @otpmesh.endpoint
    def order(self) -> list[int]:
        return self.started


class Relay(otpmesh.Actor):
    """A concurrent endpoint that replies through its port (Monarch's
    ``@concurrent_endpoint(explicit_response_port=True)``), after its reply is sent."""

    def __init__(self) -> None:
        self.go = trio.Event()

    @otpmesh.endpoint(concurrent=True, reply_port=True)
    async def relay(self, port: otpmesh.Port[int], x: int) -> None:
        await self.go.wait()
        port.send(x * 2)
        await trio.sleep(0)  # still running after the caller has its value

    @otpmesh.endpoint
    def release(self) -> None:
        self.go.set()


class Pinger(otpmesh.Actor):
    """Re-entrant ping-pong: A.ping -> B.pong -> A.ping_back."""

    def __init__(self) -> None:
        self.hits = 0

    @otpmesh.endpoint
    async def ping(self, peer: otpmesh.ActorRef, me: otpmesh.ActorRef, back: str) -> int:
        result: int = await peer.pong(me, back)
        return result

    @otpmesh.endpoint
    async def pong(self, peer: otpmesh.ActorRef, back: str) -> int:
        result: int = await peer.endpoint(back).call_one()
        return result

    @otpmesh.endpoint(concurrent=True)
    async def ping_back(self) -> int:
        self.hits += 1
        return self.hits

    @otpmesh.endpoint
    async def serial_back(self) -> int:
        return -1


class Progressing(otpmesh.Actor):
    """A concurrent call that progresses beside one that hangs."""

    @otpmesh.endpoint(concurrent=True)
    async def steady(self, steps: int) -> int:
        for _ in range(steps):
            await trio.sleep(0.05)
            otpmesh.progress()  # marks this call, not the hung one
        return steps

    @otpmesh.endpoint(concurrent=True)
    async def stuck(self) -> None:
        await trio.sleep_forever()

    @otpmesh.endpoint
    def ping(self) -> str:
        return "pong"


class AioGather(otpmesh.Actor, loop="asyncio"):
    """Gather's meeting, as asyncio tasks."""

    def __init__(self) -> None:
        self.arrived = 0
        self.all_here: asyncio.Event | None = None

    @otpmesh.endpoint(concurrent=True)
    async def meet(self, i: int, n: int) -> int:
        if self.all_here is None:
            self.all_here = asyncio.Event()
        self.arrived += 1
        if self.arrived == n:
            self.all_here.set()
        await self.all_here.wait()
        return i


class Blocker(otpmesh.Actor):
    """Blocking plain-def endpoints: they run in a worker thread."""

    def __init__(self) -> None:
        self.state = 0

    @otpmesh.endpoint(blocking=True)
    def ask(self, other: otpmesh.ActorRef, x: Any) -> Any:
        time.sleep(0.01)  # blocks this thread only
        return trio.from_thread.run(other.echo.call_one, x)

    @otpmesh.endpoint(blocking=True)
    def call_back(self, caller: otpmesh.ActorRef) -> Any:
        return trio.from_thread.run(caller.ping.call_one)

    @otpmesh.endpoint(blocking=True)
    def where(self) -> dict[str, Any]:
        otpmesh.progress()
        return {"path": otpmesh.context().path, "chain_ok": True}

    @otpmesh.endpoint(blocking=True)
    def finish(self) -> str:
        self.stop()
        return "stopping"

    @otpmesh.endpoint(blocking=True)
    def nap(self, steps: int) -> int:
        for _ in range(steps):
            time.sleep(0.05)
            otpmesh.progress()
        return steps

    @otpmesh.endpoint(blocking=True)
    def wedge(self) -> None:
        while True:
            time.sleep(0.05)

    @otpmesh.endpoint
    def ping(self) -> str:
        return "pong"


class Asker(otpmesh.Actor):
    """Calls a Blocker that calls back into it: a cycle through a blocking endpoint."""

    @otpmesh.endpoint
    async def around(self, blocker: otpmesh.ActorRef, me: otpmesh.ActorRef) -> Any:
        return await blocker.call_back(me)

    @otpmesh.endpoint
    def ping(self) -> str:
        return "pong"


class Counting(otpmesh.Actor):
    def __init__(self) -> None:
        self.count = 0

    @otpmesh.endpoint
    def bump(self) -> int:
        self.count += 1
        return self.count


class Lenient(Counting, let_it_crash=False):
    """Every endpoint replies its exception (the class's policy, inherited ones too), but
    `strict`."""

    @otpmesh.endpoint
    def fail(self) -> None:
        self.count += 1
        raise ValueError("lenient fail")

    @otpmesh.endpoint(let_it_crash=True)
    def strict(self) -> None:
        raise ValueError("strict fail")


class Counter(Counting):
    """The default policy beside an endpoint that replies."""

    @otpmesh.endpoint(let_it_crash=False)
    def soft(self) -> None:
        self.count += 1
        raise KeyError("soft fail")

    @otpmesh.endpoint
    def hard(self) -> None:
        raise RuntimeError("hard fail")


class Answerable(Counting):
    """Monarch's rule: an exception goes back to a caller; a broadcast's crashes the actor."""

    @otpmesh.endpoint(let_it_crash=otpmesh.UNANSWERED)
    def picky(self) -> None:
        self.count += 1
        raise LookupError("picky fail")
