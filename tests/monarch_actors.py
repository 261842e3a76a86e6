"""Monarch-style actors for tests/test_monarch.py, written as a Monarch user writes them (only
the import changed). Importable by worker processes."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from otpmesh.monarch import (
    Actor,
    ActorMesh,
    MeshFailure,
    Port,
    ProcMesh,
    concurrent_endpoint,
    context,
    current_rank,
    current_size,
    endpoint,
    get_or_spawn_controller,
    this_host,
)


class Counter(Actor):
    def __init__(self, initial: int) -> None:
        self.value = initial
        self.seen: list[int] = []

    @endpoint
    def incr(self) -> None:
        self.value += 1

    @endpoint
    def record(self, i: int) -> None:
        self.seen.append(i)

    @endpoint
    def recorded(self) -> list[int]:
        return self.seen

    @endpoint
    def get_value(self) -> int:
        return self.value

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def where(self) -> dict[str, Any]:
        rank = current_rank()
        return {
            "rank": rank.rank,
            "coords": dict(rank),
            "size": dict(current_size()),
            "id": context().actor_instance.actor_id,
        }

    @endpoint
    def fail(self, message: str) -> None:
        raise ValueError(message)


class Caller(Actor):
    """Calls other actors from plain and async endpoints, Monarch's way."""

    @endpoint
    def total_of(self, counters: ActorMesh[Counter]) -> int:
        # A plain def endpoint blocks on .get(): it runs on the actor's own thread.
        return sum(counters.get_value.call().get().values())

    @endpoint
    def bump_all(self, counters: ActorMesh[Counter]) -> None:
        counters.incr.broadcast()

    @endpoint
    def call_back(self, other: ActorMesh[Any]) -> Any:
        return other.ask_back.call_one(context().actor_instance.actor_id).get()

    @endpoint
    def ping(self) -> str:
        return "pong"


class AsyncCaller(Actor):
    """Calls other actors from async endpoints (an actor's endpoints are all async or all
    plain, as Monarch requires)."""

    @endpoint
    async def total_awaited(self, counters: ActorMesh[Counter]) -> int:
        await asyncio.sleep(0)  # asyncio code runs in endpoints, as in Monarch
        values = await counters.get_value.call()
        return sum(values.values())


class Echo(Actor):
    """Calls back the actor that called it: a cycle Monarch code can write by mistake."""

    def __init__(self, caller: ActorMesh[Caller]) -> None:
        self.caller = caller

    @endpoint
    def ask_back(self, who: str) -> str:
        return self.caller.ping.call_one().get()


class Cleaner(Actor):
    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: Exception | None) -> None:
        with open(self.path, "a") as f:
            f.write(f"cleanup {exc is None}\n")


class ThreadLocal(Actor):
    """State in a threading.local made by the constructor: Monarch runs the constructor and
    every endpoint on one thread."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.local.value = 0

    @endpoint
    def increment(self) -> None:
        self.local.value += 1

    @endpoint
    def value(self) -> int:
        return self.local.value

    @endpoint
    def loop_visible(self) -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True


class Spawner(Actor):
    """Spawns and calls a mesh from its constructor, blocking on .get() there."""

    def __init__(self) -> None:
        self.counters = this_host().spawn_procs(per_host={"procs": 2}).spawn("owned", Counter, 4)
        self.first = sum(self.counters.get_value.call().get().values())

    @endpoint
    def first_total(self) -> int:
        return self.first

    @endpoint
    def rank_text(self) -> str:
        return str(current_rank())


class Mortal(Actor):
    @endpoint
    def die(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def ping(self) -> str:
        return "pong"


class Manager(Actor):
    """Owns a mesh it spawned; Monarch's __supervise__ hears of its failures."""

    def __init__(self, handle: bool) -> None:
        self.handle = handle
        self.failures: list[str] = []
        self.workers = this_host().spawn_procs(per_host={"procs": 2}).spawn("workers", Mortal)

    @endpoint
    def break_one(self) -> None:
        self.workers.slice(procs=1).die.broadcast(3)

    @endpoint
    def seen(self) -> list[str]:
        return self.failures

    def __supervise__(self, failure: MeshFailure) -> Any:
        self.failures.append(str(failure))
        return 1 if self.handle else None  # any truthy value handles it, as in Monarch


class Builder(Actor):
    """Spawns on a proc mesh it was sent, and finds the app's controller actor."""

    @endpoint
    def build_on(self, procs: ProcMesh) -> int:
        counters = procs.spawn("built", Counter, 2)
        return sum(counters.get_value.call().get().values())

    @endpoint
    def controller_value(self) -> int:
        controller = get_or_spawn_controller("shared", Counter, 10).get()
        controller.incr.call_one().get()
        return controller.get_value.call_one().get()


class SendAlot(Actor):
    @endpoint
    async def send(self, port: Port[int], n: int) -> None:
        for i in range(n):
            port.send(i)


class Ported(Actor):
    """Answers through an explicit response port, now or later."""

    def __init__(self) -> None:
        self.waiting: list[Port[int]] = []

    @endpoint(explicit_response_port=True)
    def add(self, port: Port[int], b: int) -> None:
        port.send(3 + b)

    @endpoint(explicit_response_port=True)
    def later(self, port: Port[int]) -> None:
        self.waiting.append(port)

    @endpoint
    def release(self, value: int) -> int:
        waiting, self.waiting = self.waiting, []
        for port in waiting:
            port.send(value)
        return len(waiting)

    @endpoint(explicit_response_port=True)
    def fail(self, port: Port[None]) -> None:
        raise RuntimeError("never answered")


class Gate(Actor):
    """Monarch's concurrent-endpoint example: waiters block until another call releases them."""

    def __init__(self) -> None:
        self.unblock = asyncio.Event()
        self.waiting = 0

    @concurrent_endpoint
    async def wait(self, i: int) -> int:
        self.waiting += 1
        await self.unblock.wait()
        return i

    @concurrent_endpoint
    async def how_many(self) -> int:
        return self.waiting

    @endpoint
    async def release(self) -> None:
        self.unblock.set()


class Relay(Actor):
    """Asks other actors with a blocking .get() from plain defs, Monarch's sync style."""

    @endpoint
    def ask(self, counters: ActorMesh[Counter]) -> list[int]:
        return counters.get_value.call().get().values()


class Hatchery(Actor):
    """Sends a mesh it is still spawning through a port, then blocks in its constructor for
    ever (its neighbours in the process must be served meanwhile)."""

    def __init__(self, procs: ProcMesh, port: Port[ActorMesh[Counter]]) -> None:
        port.send(procs.spawn("hatched", Counter, 42))
        threading.Event().wait()

    @endpoint
    def unreachable(self) -> None:
        pass


class Doom(BaseException):
    """Not an Exception: Monarch's actors die of it."""


class Doomed(Actor):
    @endpoint
    async def fall(self) -> None:
        raise Doom("the floor gave way")

    @endpoint
    async def ping(self) -> str:
        return "pong"


class Refuser(Actor):
    def __init__(self) -> None:
        raise ValueError(f"rank {current_rank().rank} will not start")

    @endpoint
    def ping(self) -> str:
        return "pong"


class PortFailer(Actor):
    """Explicit-port endpoints that raise instead of answering."""

    @endpoint(explicit_response_port=True)
    async def fail(self, port: Port[None]) -> None:
        raise ValueError("no answer from fail")

    @concurrent_endpoint(explicit_response_port=True)
    async def fail_concurrently(self, port: Port[None]) -> None:
        raise ValueError("no answer from fail_concurrently")

    @endpoint
    async def ping(self) -> str:
        return "pong"


class Aborter(Actor):
    @endpoint
    def abort(self, reason: str | None) -> str:
        context().actor_instance.abort(reason)
        return "not reached"  # abort() ends the endpoint here


class FileFinalizer:
    """Writes "finalized" to its file when collected (its file is opened early: at
    interpreter exit ``open`` may be gone)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "w")

    def __del__(self) -> None:
        self._file.write("finalized")
        self._file.close()


#: Set in a worker by Finalizing: a module global, collected only when the module is cleared.
_finalized_at_exit: FileFinalizer | None = None


class Finalizing(Actor):
    def __init__(self, path: str) -> None:
        global _finalized_at_exit
        _finalized_at_exit = FileFinalizer(path)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Watcher(Actor):
    """Spawns a Doomed child on processes it was given, fails it, and waits in an endpoint
    until its own __supervise__ has heard of the failure."""

    def __init__(self, procs: ProcMesh) -> None:
        self.child = procs.spawn("doomed", Doomed)
        self.heard: list[str] = []
        self.failed = asyncio.Event()

    @endpoint
    async def fail_child_and_wait(self) -> str:
        self.child.fall.broadcast()
        await self.failed.wait()  # set by __supervise__, while this endpoint waits
        return self.heard[0]

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.heard.append(str(failure))
        self.failed.set()
        return True


class RaisingWatcher(Watcher):
    """A Watcher whose __supervise__ raises: it handles nothing, and its actor fails."""

    def __supervise__(self, failure: MeshFailure) -> bool:
        raise RuntimeError("boom from __supervise__")
