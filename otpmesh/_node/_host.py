"""Starting and stopping actors inside one node: a worker process's, or the controller's own
(``placement="local"``). The supervision driver talks to hosts; hosts talk to cells."""

from __future__ import annotations

import contextvars
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any

import trio

from .._core._actor import ASYNCIO, Actor, ActorContext, runs_on, served, set_context
from .._core._errors import SpawnError
from .._core._exits import ActorCrash, Hung, Ignore
from .._core._healspec import heal_problem
from .._core._reasons import NOPROC
from . import _raised
from ._aioloop import asyncio_thread
from ._cell import ActorCell
from ._heal import heal
from ._mainmodule import MainModule, import_class
from ._node import Node
from ._serving import Starting

log = logging.getLogger("otpmesh.actor")

STARTED = "started"
IGNORED = "ignored"

ExitCallback = Callable[[str, int, object], None]
ExitingCallback = Callable[[str, int], None]


def spawn_request(
    path: str,
    incarnation: int,
    cls: type | str,
    *,
    name: str,
    rank: int = 0,
    coords: dict[str, int] | None = None,
    shape: dict[str, int] | None = None,
    args: Any = (),
    kwargs: Any = None,
    progress_deadline: float | None = None,
    start_timeout: float | None = None,
    heal: Any = None,
) -> dict[str, Any]:
    """What ``ActorHost.spawn`` reads (the ``spawn_actor`` operation's payload): `cls` an actor
    class, or its ``module:qualname`` (imported where it starts)."""
    return {
        "id": path,
        "incarnation": incarnation,
        "cls": cls,
        "name": name,
        "rank": rank,
        "coords": coords or {},
        "shape": shape or {},
        "args": list(args),
        "kwargs": dict(kwargs or {}),
        "progress_deadline": progress_deadline,
        "start_timeout": start_timeout,
        "heal": heal,
    }


class StartFailed(Exception):
    """Raised by ``ActorHost.spawn`` when the actor's constructor or ``on_start`` raised or
    hung: `crash` is what it raised, with the user's frames only, or the ``Hung`` the watchdog
    found (the start's exit reason)."""

    def __init__(self, crash: ActorCrash | Hung) -> None:
        self.crash = crash
        super().__init__(str(crash))


class ActorHost:
    """The actors of one node. ``on_exit(path, incarnation, reason)`` hears every exit."""

    def __init__(
        self,
        node: Node,
        on_exit: ExitCallback,
        on_exiting: ExitingCallback | None = None,
        nursery: trio.Nursery | None = None,
        main: MainModule | None = None,
        passing: tuple[type[BaseException], ...] = _raised.IN_CONTROLLER,
    ) -> None:
        self.node = node
        # What the controller's __main__ is rebuilt from, for classes defined in it: given at
        # fork time by this process's parent, never taken from a message (_mainmodule.py).
        self._main = main or MainModule()
        self._on_exit = on_exit
        self._on_exiting = on_exiting
        self._nursery = nursery  # where actor tasks run (default: the node's)
        self._passing = passing  # what goes on through the actors' code (_raised.py)
        #: The actors being started now, by path: their deadlines, for the watchdog.
        self.starting: dict[str, Starting] = {}

    async def spawn(self, p: dict[str, Any]) -> str:
        """Construct and start an actor; return 'started' or 'ignored'. StartFailed if its
        constructor or on_start raised (logged here, with the user's frames); other errors
        (no such class, already running) are raised as they are."""
        cls: type[Actor] = (
            p["cls"] if isinstance(p["cls"], type) else import_class(p["cls"], self._main)
        )
        ctx = ActorContext(
            name=p["name"],
            path=p["id"],
            rank=p["rank"],
            coords=p["coords"],
            shape=p["shape"],
            pid=os.getpid(),
        )
        old = self.node.actors.get(ctx.path)
        if old is not None and old.alive:
            raise SpawnError(f"{ctx.path} is already running (incarnation {old.incarnation})")
        plan = p.get("heal")
        problem = heal_problem(cls, plan["fallback"]) if plan else None
        if problem is not None:  # a class named by import path: not checked with the spec
            raise SpawnError(f"{ctx.path} cannot heal from a peer: {problem}")

        async def run(hook: Coroutine[Any, Any, Any]) -> None:  # load_state, the fallback
            if runs_on(cls) == ASYNCIO:  # on the loop (the thread) its endpoints will run on
                await asyncio_thread().run(hook, contextvars.copy_context())
            else:
                await hook

        start = Starting(
            ctx.path, p.get("incarnation", 1), p.get("progress_deadline"), p.get("start_timeout")
        )
        # This task only: the constructor and on_start see the actor's context, and
        # otpmesh.progress() in them starts the start's progress deadline again.
        set_context(ctx, progress=start.serving.mark)
        self.starting[ctx.path] = start
        try:
            with trio.CancelScope() as start.scope:
                start.task = trio.lowlevel.current_task()
                instance = await self._construct(cls, p, start)
                if plan:  # before its cell exists: nothing is served until it is loaded
                    start.serving.is_async = True
                    await heal(ctx.path, instance, plan, run)
            if start.reason is not None:  # the watchdog cancelled it
                log.error("%s failed to start: %s", ctx.path, start.reason)
                raise StartFailed(start.reason)
        except Ignore:
            return IGNORED
        except StartFailed:
            raise
        except BaseException as exc:
            passing, raised = _raised.split(exc, self._passing)
            if passing is not None:
                raise
            # The user's frames only (spawn's and _construct's; an asyncio actor's pass through
            # the loop and _constructed too).
            skip = 4 if runs_on(cls) == ASYNCIO else 2
            crash = ActorCrash.of(raised or exc, skip_frames=skip)
            log.error("%s failed to start:\n%s", ctx.path, crash.traceback.rstrip())
            raise StartFailed(crash) from None
        finally:
            start.done = True
            del self.starting[ctx.path]
        cell = ActorCell(
            self.node,
            ctx,
            p.get("incarnation", 1),
            instance,
            served(cls),
            self._exited,
            self._exiting,
            progress_deadline=p.get("progress_deadline"),
            passing=self._passing,
            supervised=p.get("supervised", True) is not False,
        )
        nursery = self._nursery or self.node.nursery
        if nursery is None:
            raise SpawnError("the node is not serving")
        self.node.actors[ctx.path] = cell
        self.node.exited.pop(ctx.path, None)
        nursery.start_soon(cell.run)
        return STARTED

    @staticmethod
    async def _construct(cls: type[Actor], p: dict[str, Any], start: Starting) -> Actor:
        """The instance, constructed and started (``on_start``) where its code will run."""
        if runs_on(cls) == ASYNCIO:  # on the loop (the thread) its endpoints will run on
            loop = asyncio_thread()
            start.serving.thread = loop.ident  # where its stack is read if it hangs
            return await loop.run(
                _constructed(cls, p["args"], p["kwargs"]), contextvars.copy_context()
            )
        instance = cls(*p["args"], **p["kwargs"])
        start.serving.is_async = True  # on_start awaits on the loop: it can be cancelled
        await instance.on_start()
        return instance

    async def stop(
        self, actor_id: str, incarnation: int, reason: object, timeout: float | None, brutal: bool
    ) -> object:
        """Stop an actor: kill at once (brutal), or ask and kill after `timeout` (None: wait).
        Returns the reason it exited with (which may be an earlier crash, as in OTP)."""
        cell = self.node.actors.get(actor_id)
        if cell is None or cell.incarnation != incarnation:
            last = self.node.last_exit.get(actor_id)
            return last[1] if last is not None and last[0] == incarnation else NOPROC
        if brutal:
            cell.kill()
        else:
            cell.request_stop(reason)
            if timeout is not None:
                with trio.move_on_after(timeout):
                    await cell.finished.wait()
                if not cell.finished.is_set():
                    cell.kill()
        await cell.finished.wait()
        return cell.exit_reason

    def inject(self, actor_id: str, kind: str, reason: object) -> bool:
        """otpmesh.chaos: make a running actor crash (at once) or exit (after its current
        message) with `reason`, kill it, or wedge its next endpoint (for `reason` seconds, or
        for ever when it is not a number). False when no such actor is running."""
        cell = self.node.actors.get(actor_id)
        if cell is None or not cell.alive:
            return False
        if kind == "crash":
            cell.crash(reason)
        elif kind == "exit":
            cell.request_stop(reason)
        elif kind == "kill":
            cell.kill()
        elif kind == "wedge":
            cell.wedge = (reason if isinstance(reason, int | float) else None,)
        else:
            raise ValueError(f"unknown fault {kind!r}")
        return True

    def _exiting(self, cell: ActorCell) -> None:
        if self._on_exiting is not None:
            self._on_exiting(cell.ctx.path, cell.incarnation)

    def _exited(self, cell: ActorCell) -> None:
        path = cell.ctx.path
        if self.node.actors.get(path) is cell:
            del self.node.actors[path]
        self.node.exited[path] = cell.describe_exit()
        self.node.last_exit[path] = (cell.incarnation, cell.exit_reason)
        self._on_exit(path, cell.incarnation, cell.exit_reason)


async def _constructed(cls: type[Actor], args: list[Any], kwargs: dict[str, Any]) -> Actor:
    """An asyncio actor, constructed and started on its asyncio thread: what its constructor
    makes (thread-locals, asyncio objects) belongs to the thread and loop its code runs on."""
    instance = cls(*args, **kwargs)
    await instance.on_start()
    return instance
