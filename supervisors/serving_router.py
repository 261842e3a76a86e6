"""Serving through a router: it owns its engine replicas, streams each request's tokens to the
caller, and carries a request on to a live replica when its own dies, from the first token the
caller has not had: nothing lost, nothing repeated.

    python supervisors/serving_router.py

The tree::

    serving             Supervisor  ONE_FOR_ONE
    └── router          Worker: Router, which owns
        └── engines     Mesh  procs=N, ONE_FOR_ONE, 2 x N restarts per 60 s

Why the router owns the engines (``context().start``): they live and die with it, and
``otpmesh watch`` and ``app.view()`` show them under it. Why one-for-one: replicas share nothing,
so a dead one is restarted alone while the others serve on with their warm state. Why no error
policy anywhere: otpmesh's default makes an engine's death the news of the request that was on
it, not a crash of the router (docs/guides/endpoints.md), and the router answers that news by
resuming the request on another replica.

- **Streaming**: the caller passes a ``Port``; the router relays each token as it comes from the
  engine (``asyncio`` actors: ``loop="asyncio"``), counting them.
- **Resuming**: when the engine dies mid-request, the router asks another replica to go on from
  the tokens already relayed (the toy engine is deterministic, as greedy decoding with a fixed
  seed is). What the dead engine sent after that count is dropped with its channel.
- **Backpressure**: at most ``inflight`` requests run at once (``@endpoint(concurrent=N)``);
  past it the router's mailbox holds them, and past that its callers wait.
- **Graceful drain**: ``drain()`` refuses new requests and returns once those in flight ended;
  then the tree can stop without cutting a stream.

docs/guides/serving.md tells the story; ``python -m otpmesh.bench serving`` measures it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, Mesh, Supervisor, Worker

#: How long a dead engine's last tokens have to arrive before its channel is closed.
LATE_TOKENS = 0.05
#: How long a replica whose call failed is passed over when choosing one.
PASS_OVER = 1.0


def token(prompt: str, index: int) -> str:
    """The toy model: the `index`-th token of `prompt` (deterministic: resumable anywhere)."""
    return f"{prompt}:{index}"


class Engine(otpmesh.Actor, loop="asyncio"):
    """One replica: an asyncio engine that streams a prompt's tokens, one per decode step."""

    def __init__(self, step: float) -> None:
        self.step = step

    @otpmesh.endpoint(concurrent=True)  # requests decode side by side, as in a batch
    async def generate(self, prompt: str, n: int, start: int, port: otpmesh.Port[str]) -> int:
        for index in range(start, n):
            await asyncio.sleep(self.step)  # a decode step
            port.send(token(prompt, index))
        port.close()
        return n - start

    @otpmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


class Router(otpmesh.Actor):
    def __init__(self, replicas: int = 4, step: float = 0.002) -> None:
        self.replicas, self.step = replicas, step
        self.inflight, self.draining, self.resumed = 0, False, 0
        self.idle = trio.Event()
        self.passed_over: dict[int, float] = {}
        self.next = 0

    async def on_start(self) -> None:
        spec = Mesh(
            "engines",
            Engine,
            args=(self.step,),
            shape={"procs": self.replicas},
            strategy=ONE_FOR_ONE,
            intensity=2 * self.replicas,
            period=60.0,
        )
        self.engines = await otpmesh.context().start(spec)

    @otpmesh.endpoint(concurrent=32, let_it_crash=False)
    async def generate(self, prompt: str, n: int, client: otpmesh.Port[str]) -> int:
        """Stream `n` tokens of `prompt` to `client`; the replicas it took (more than one when
        its engine died on the way)."""
        if self.draining:
            raise RuntimeError("the router is draining: it takes no new requests")
        self.inflight += 1
        try:
            sent, replicas = 0, 0
            while sent < n:
                replicas += 1
                sent += await self._relay(self._choose(), prompt, n, sent, client)
            client.close()
            self.resumed += replicas > 1
            return replicas
        finally:
            self.inflight -= 1
            if not self.inflight:
                self.idle.set()

    async def _relay(
        self, replica: int, prompt: str, n: int, start: int, client: otpmesh.Port[str]
    ) -> int:
        """Have `replica` stream from token `start`, each token on to `client`; how many were."""
        port, receiver = otpmesh.Channel[str].open()
        relayed = 0

        async def call() -> None:
            try:
                await self.engines.mesh()[replica].generate(prompt, n, start, port)
            except (otpmesh.ActorDiedError, otpmesh.CallTimeoutError):
                self.passed_over[replica] = time.monotonic() + PASS_OVER
                await trio.sleep(LATE_TOKENS)  # what it sent before it died
                receiver.close()  # the rest is dropped: the next replica sends it

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            async for tok in receiver:  # ends at the engine's close, or the router's
                client.send(tok)
                relayed += 1
        return relayed

    def _choose(self) -> int:
        """The next replica in turn, passing over those whose call just failed."""
        now = time.monotonic()
        for _ in range(self.replicas):
            replica, self.next = self.next, (self.next + 1) % self.replicas
            if self.passed_over.get(replica, 0.0) <= now:
                return replica
        return self.next  # all failed just now: the next one's restart is waited for

    @otpmesh.endpoint
    async def drain(self) -> int:
        """Take no new requests; return once those in flight have ended (how many resumed on
        another replica so far)."""
        self.draining = True
        if self.inflight:
            self.idle = trio.Event()
            await self.idle.wait()
        return self.resumed

    @otpmesh.endpoint
    async def engine_pids(self) -> list[int]:
        return list((await self.engines.mesh().pid()).values())


def make_tree(replicas: int = 4, step: float = 0.002) -> Supervisor:
    return Supervisor(
        "serving",
        strategy=ONE_FOR_ONE,
        children=[Worker("router", Router, args=(replicas, step), shutdown=30.0)],
    )


async def main() -> None:
    async with otpmesh.start(make_tree()) as app:
        router = app.actor("serving/router")
        port, receiver = otpmesh.Channel[str].open()
        await router.generate("hello", 5, port)
        print([tok async for tok in receiver])
        print("drained; resumed on another replica:", await router.drain())


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(f"usage: python {sys.argv[0]}")
    otpmesh.run(main)
