"""Actors of the tests of how actors and their processes end (importable by worker processes):
code that raises BaseExceptions, processes that run exit functions."""

from __future__ import annotations

import os

import trio

import otpmesh

# ---- actors whose code raises BaseExceptions ------------------------------------------------


class Boom(BaseException):
    """A BaseException subclass of the user's own (not an Exception)."""


def base_exception(kind: str) -> BaseException:
    """The BaseException called `kind`: 'boom', 'keyboard', 'generator', 'exit0', 'exit3'."""
    return {
        "boom": Boom("not an Exception"),
        "keyboard": KeyboardInterrupt(),
        "generator": GeneratorExit(),
        "exit0": SystemExit(0),
        "exit3": SystemExit(3),
    }[kind]


class Raiser(otpmesh.Actor):
    """Raises the BaseException it is asked for: from an async or a plain-def endpoint, from its
    constructor or on_start (`at`), or from on_stop."""

    def __init__(self, at: str = "", kind: str = "boom") -> None:
        self.kind = kind
        self.at = at
        if at == "init":
            raise base_exception(kind)

    async def on_start(self) -> None:
        if self.at == "on_start":
            raise base_exception(self.kind)

    async def on_stop(self, reason: object) -> None:
        if self.at == "on_stop":
            raise base_exception(self.kind)

    @otpmesh.endpoint
    async def raise_async(self, kind: str) -> None:
        await trio.sleep(0)
        raise base_exception(kind)

    @otpmesh.endpoint
    def raise_sync(self, kind: str) -> None:
        raise base_exception(kind)

    @otpmesh.endpoint
    async def raise_in_nursery(self, kind: str) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            raise base_exception(kind)

    @otpmesh.endpoint
    async def wait_in_nursery(self) -> None:
        """Waits for ever with a task of its own: a crash from outside cancels both."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            await trio.sleep_forever()

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


# ---- actors whose processes end in order -----------------------------------------------------


def write_marker(path: str) -> None:
    with open(path, "w") as f:
        f.write(str(os.getpid()))


class Tidy(otpmesh.Actor):
    """Registers an atexit function and a finalizer in its worker, each writing a file."""

    @otpmesh.endpoint
    def register_exit(self, directory: str) -> int:
        import atexit
        import weakref

        pid = os.getpid()
        atexit.register(write_marker, f"{directory}/atexit-{pid}")
        self.resource = Tidy()  # any object this actor owns
        weakref.finalize(self.resource, write_marker, f"{directory}/finalizer-{pid}")
        return pid
