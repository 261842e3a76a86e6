"""Actors whose code is asyncio code, for tests/test_asyncio_actors.py."""

from __future__ import annotations

import asyncio
from typing import Any

import otpmesh


class Engine:
    """A stand-in for an asyncio inference engine (vLLM's AsyncLLMEngine has this shape): a
    background task serves queued requests and answers each through its future."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[str, asyncio.Future[str]]] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            prompt, answer = await self._queue.get()
            await asyncio.sleep(0.001)  # the "forward pass"
            if not answer.done():
                answer.set_result(prompt.upper())

    async def generate(self, prompt: str) -> str:
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        await self._queue.put((prompt, answer))
        return await answer

    def close(self) -> None:
        self._task.cancel()


async def _http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    request = await reader.readuntil(b"\r\n\r\n")
    path = request.split(b" ")[1]
    body = b"you asked for " + path
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    writer.close()


class Rollout(otpmesh.Actor, loop="asyncio"):
    """An asyncio actor: an engine, an HTTP server and client, and awaits that get stuck."""

    async def on_start(self) -> None:
        self.engine = Engine()
        self.server = await asyncio.start_server(_http, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.cancelled: list[str] = []

    async def on_stop(self, reason: object) -> None:
        self.engine.close()
        self.server.close()

    @otpmesh.endpoint
    async def generate(self, prompt: str) -> str:
        return await self.engine.generate(prompt)

    @otpmesh.endpoint
    async def fetch(self, path: str) -> str:
        """An HTTP GET with plain asyncio streams."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        await writer.drain()
        response = await reader.read()
        writer.close()
        return response.split(b"\r\n\r\n", 1)[1].decode()

    @otpmesh.endpoint
    async def loop_and_path(self) -> list[Any]:
        return [type(asyncio.get_running_loop()).__name__, otpmesh.context().path]

    @otpmesh.endpoint
    async def stuck(self) -> None:
        await asyncio.Event().wait()

    @otpmesh.endpoint
    async def slow(self, label: str) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.append(label)
            raise

    @otpmesh.endpoint
    def cancelled_calls(self) -> list[str]:
        return self.cancelled

    @otpmesh.endpoint
    async def ask(self, ref: otpmesh.ActorRef, prompt: str) -> str:
        """Call another actor from asyncio code."""
        answer: str = await ref.generate(prompt)
        return answer

    @otpmesh.endpoint
    async def ask_all(self, ref: otpmesh.ActorRef, prompts: list[str]) -> list[str]:
        """Call another actor once per prompt from asyncio code, all at once (gather)."""
        return await otpmesh.gather(*(ref.generate(p) for p in prompts))

    @otpmesh.endpoint
    async def stop_me(self) -> str:
        self.stop()
        return "stopping"


class TrioActor(otpmesh.Actor):
    """A plain (trio) actor whose endpoint tries asyncio."""

    @otpmesh.endpoint
    async def nap(self) -> None:
        await asyncio.sleep(0.01)
