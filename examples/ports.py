"""Ports: an endpoint that replies later, and many replies streamed through a channel.

A Batcher answers each ``submit`` only once its batch of 3 is full: it keeps each caller's
reply port until then (``@endpoint(reply_port=True)``). A mesh of Samplers streams samples
into one Channel that the controller reads. Then the batcher is SIGKILLed while a call waits
on its reply port: the caller gets ActorDiedError, not a hang, and the supervisor restarts it.

    python examples/ports.py
"""

from __future__ import annotations

import trio

import otpmesh
from otpmesh import Mesh, Supervisor, Worker, chaos


class Batcher(otpmesh.Actor):
    def __init__(self, size: int = 3) -> None:
        self.size = size
        self.batch: list[tuple[otpmesh.Port[str], int]] = []

    @otpmesh.endpoint(reply_port=True)
    def submit(self, port: otpmesh.Port[str], item: int) -> None:
        self.batch.append((port, item))
        if len(self.batch) == self.size:  # the last one in answers everyone in the batch
            total = sum(item for _, item in self.batch)
            for waiting, mine in self.batch:
                waiting.send(f"item {mine} went in a batch of total {total}")
            self.batch = []

    @otpmesh.endpoint
    def waiting(self) -> int:
        return len(self.batch)


class Sampler(otpmesh.Actor):
    @otpmesh.endpoint
    def sample(self, port: otpmesh.Port[tuple[int, int]], n: int) -> None:
        rank = otpmesh.context().rank
        for i in range(n):
            port.send((rank, i * rank))


TREE = Supervisor(
    "app",
    children=[Worker("batcher", Batcher), Mesh("samplers", Sampler, shape={"procs": 3})],
)


async def submit(batcher: otpmesh.ActorRef, item: int) -> None:
    try:
        print(await batcher.submit(item))
    except otpmesh.ActorDiedError as exc:
        print(f"item {item}: ActorDiedError, delivered={exc.delivered}: {exc.reason}")


async def main() -> None:
    async with otpmesh.start(TREE) as app:
        batcher = app.actor("app/batcher")
        async with trio.open_nursery() as nursery:  # three callers wait; the third answers all
            for item in (1, 2, 3):
                nursery.start_soon(submit, batcher, item)

        port, receiver = otpmesh.Channel[tuple[int, int]].open()
        await app.mesh("app/samplers").sample(port, 2)
        samples = sorted([await receiver.recv() for _ in range(6)])
        print(f"6 samples from 3 actors: {samples}")

        async with trio.open_nursery() as nursery:  # a caller waits; the batcher is killed
            nursery.start_soon(submit, batcher, 7)
            while await batcher.waiting() == 0:
                await trio.sleep(0.01)
            await chaos.kill(app, "app/batcher")
        await app.settled()
        print(f"restarted, batch now {await batcher.waiting()} long")


if __name__ == "__main__":
    otpmesh.run(main)
