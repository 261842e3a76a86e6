"""Actor classes used by the runtime tests (importable by worker processes)."""

from __future__ import annotations

import os
from typing import Any

import trio

import otpmesh


class Echo(otpmesh.Actor):
    def __init__(self, tag: str = "echo") -> None:
        self.tag = tag
        self.seen: list[Any] = []

    @otpmesh.endpoint
    async def echo(self, x: Any) -> Any:
        return x

    @otpmesh.endpoint
    def echo_sync(self, x: Any) -> Any:
        return x

    @otpmesh.endpoint
    def whoami(self) -> dict[str, Any]:
        ctx = otpmesh.context()
        return {
            "name": ctx.name,
            "path": ctx.path,
            "rank": ctx.rank,
            "coords": ctx.coords,
            "shape": ctx.shape,
            "pid": os.getpid(),
            "tag": self.tag,
        }

    @otpmesh.endpoint
    def record(self, x: Any) -> None:
        self.seen.append(x)

    @otpmesh.endpoint
    def history(self) -> list[Any]:
        return self.seen

    @otpmesh.endpoint
    async def sleep(self, seconds: float) -> float:
        await trio.sleep(seconds)
        return seconds

    @otpmesh.endpoint
    def fail(self, message: str) -> None:
        raise ValueError(message)

    @otpmesh.endpoint(let_it_crash=False)
    def fail_softly(self, message: str) -> None:
        raise KeyError(message)

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @otpmesh.endpoint
    def shout(self, text: str) -> None:
        print(text, flush=True)

    @otpmesh.endpoint
    async def call_peer(self, peer: Any, x: Any) -> dict[str, Any]:
        """Call another actor through a ref passed in a message."""
        value = await peer.echo(x)
        return {"value": value, "via_pid": os.getpid()}

    @otpmesh.endpoint
    def torch_loaded(self) -> bool:
        import sys

        return "torch" in sys.modules

    @otpmesh.endpoint
    def unsendable(self) -> Any:
        return object()


class BadInit(otpmesh.Actor):
    def __init__(self) -> None:
        raise RuntimeError("constructor refused")
