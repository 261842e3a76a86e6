"""The actor every benchmark calls, in a module of its own: a worker that hosts it (a restarted
one too) imports this and nothing more, as a user's actor module would import only its own
code (the suites' modules, with their argument parsing, statistics and subprocess helpers,
are the controller's)."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import trio

import otpmesh


class BenchActor(otpmesh.Actor):
    """The actor every benchmark calls."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex  # tells incarnations apart

    @otpmesh.endpoint
    async def echo(self, x: Any) -> Any:
        return x  # no await: it runs at once when the actor is idle (_node/_inline.py)

    @otpmesh.endpoint
    async def echo_awaiting(self, x: Any) -> Any:
        await trio.lowlevel.checkpoint()  # it may suspend: the actor's own task runs it
        return x

    @otpmesh.endpoint
    def ident(self) -> list[Any]:
        return [os.getpid(), self.token]

    @otpmesh.endpoint
    def fail(self) -> None:
        raise RuntimeError("benchmark crash")

    @otpmesh.endpoint
    def stuck(self, seconds: float) -> None:
        time.sleep(seconds)  # a plain-def endpoint: no stop reaches it, only a kill

    @otpmesh.endpoint
    async def wedged(self) -> None:
        await trio.sleep_forever()  # an async endpoint: its deadline cancels it
