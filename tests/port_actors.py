"""Actor classes for the ports tests (importable by worker processes)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import trio

import otpmesh
from otpmesh._node._node import current_node
from otpmesh._node._ports import Port


class Later(otpmesh.Actor):
    """Replies later: ``ask`` keeps its reply port, ``answer`` (another call) sends on it."""

    def __init__(self) -> None:
        self.waiting: list[tuple[otpmesh.Port[str], str]] = []
        self.delegated: tuple[Port[Any], otpmesh.ActorRef, int] | None = None

    @otpmesh.endpoint(reply_port=True)
    def ask(self, port: otpmesh.Port[str], question: str) -> None:
        self.waiting.append((port, question))

    @otpmesh.endpoint(reply_port=True)
    async def ask_async(self, port: otpmesh.Port[str], question: str) -> None:
        await trio.sleep(0)
        self.waiting.append((port, question))

    @otpmesh.endpoint
    def answer(self, suffix: str) -> int:
        waiting, self.waiting = self.waiting, []
        for port, question in waiting:
            port.send(question + suffix)
        return len(waiting)

    @otpmesh.endpoint
    def pending(self) -> int:
        return len(self.waiting)

    @otpmesh.endpoint(reply_port=True)
    async def twice(self, port: otpmesh.Port[int], x: int) -> None:
        port.send(x)
        port.send(x + 1)  # a call has one reply: dropped

    @otpmesh.endpoint(reply_port=True)
    def refuse(self, port: otpmesh.Port[Any], message: str) -> None:
        try:
            raise ValueError(message)
        except ValueError as exc:
            port.exception(exc)

    @otpmesh.endpoint(reply_port=True)
    def delegate(self, port: otpmesh.Port[Any], helper: otpmesh.ActorRef, x: int) -> None:
        """The reply comes from another actor, which is handed the port (``hand_over``)."""
        assert isinstance(port, Port)
        self.delegated = (port, helper, x)

    @otpmesh.endpoint
    async def hand_over(self) -> bool:
        """False while no call to ``delegate`` came yet."""
        if self.delegated is None:
            return False
        port, helper, x = self.delegated
        self.delegated = None
        await helper.reply_on(port, x * 10)
        return True

    @otpmesh.endpoint
    def reply_on(self, port: otpmesh.Port[int], value: int) -> None:
        port.send(value)

    @otpmesh.endpoint
    def crash(self) -> None:
        raise RuntimeError("crashed before replying")

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


class Producer(otpmesh.Actor):
    """Sends into a Channel port it was given."""

    @otpmesh.endpoint
    def produce(self, port: otpmesh.Port[tuple[int, int]], n: int) -> None:
        rank = otpmesh.context().rank
        for i in range(n):
            port.send((rank, i))

    @otpmesh.endpoint
    def flood(self, port: otpmesh.Port[int], n: int) -> None:
        for i in range(n):
            port.send(i)

    @otpmesh.endpoint
    def close(self, port: otpmesh.Port[Any]) -> None:
        port.close()

    @otpmesh.endpoint
    def big(self, port: otpmesh.Port[Any], mib: int) -> None:
        """A tensor large enough for the tensor channel (1 MiB or more), then a small one."""
        import torch

        port.send(torch.ones(mib << 18))
        port.send(torch.ones(2))

    @otpmesh.endpoint
    def forge(self, port: otpmesh.Port[str]) -> None:
        """Send on a port with the right owner and id but a guessed token."""
        addr, port_id, token = port._to_wire()
        Port(addr, port_id, bytes(len(token))).send("forged")
        Port(addr, port_id + 1000, token).send("no such port")

    @otpmesh.endpoint
    async def gather_from(self, mesh: otpmesh.ActorMesh, n: int) -> list[tuple[int, int]]:
        port, receiver = otpmesh.Channel.open()
        await mesh.produce(port, n)
        got = []
        with trio.fail_after(30):
            for _ in range(n * len(mesh)):
                got.append(await receiver.recv())
        return sorted(got)

    @otpmesh.endpoint
    def port_stats(self) -> dict[str, int]:
        node = current_node()
        assert node is not None
        stats = node.ports.statistics()
        return {"forged": stats.forged, "gone": stats.gone, "sent": stats.sent}


class AioLater(otpmesh.Actor, loop="asyncio"):
    """Ports from asyncio code."""

    @otpmesh.endpoint(reply_port=True)
    async def ask(self, port: otpmesh.Port[int], x: int) -> None:
        await asyncio.sleep(0)
        port.send(x * 2)

    @otpmesh.endpoint
    async def roundtrip(self, n: int) -> list[int]:
        port, receiver = otpmesh.Channel[int].open()
        for i in range(n):
            port.send(i)
        port.close()
        return [value async for value in receiver]
