"""The app under a ``SupervisionMachine``: one trio run in a thread of its own, hosting the app
across hypothesis's synchronous rules; what the machine reads from it (exits, settling, the
tree that holds a path) and the worker processes it saw (none may outlive it).

Design: hypothesis runs rules synchronously, but the application is a trio program that must live
across rules. So each example gets one trio run in a thread of its own, hosting the app for the
whole example; every rule sends one task into that run and waits for it (``AppThread.run``), with
a wall-clock limit so that a wedged run fails the test instead of hanging it. Time: in-process
trees (``placement="local"``) run under ``trio.testing.MockClock``, which is driven from the trio
thread only: frozen (no autojump) while hypothesis thinks between rules, autojumping while a rule
runs, so timeouts and ``advance`` cost no wall-clock time and the event log's times are exact.
Trees over real processes (``placement="procs"``) use the real clock.
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, TypeVar

import trio
import trio.testing

from .._controller._app import App, context, start
from .._controller._tree import TreeContext
from .._core._errors import SupervisorError
from .._core._spec import Mesh, Supervisor
from .._core._supevents import LogEntry, LogKind
from .._runtime._proc import Proc

_EXITS = (LogKind.CHILD_EXITED, LogKind.CHILD_TERMINATED)

T = TypeVar("T")


class AppThread:
    """One trio run in a thread of its own, hosting ``otpmesh.start(tree)`` until ``close()``;
    ``run(fn)`` runs ``await fn()`` as a task of that run and returns its result here."""

    def __init__(
        self,
        tree: Supervisor | Mesh,
        placement: Literal["local", "procs"],
        wall_timeout: float,
        heartbeat_timeout: float | None = None,
    ) -> None:
        self.tree = tree
        self.placement = placement
        self.wall_timeout = wall_timeout
        self.heartbeat_timeout = heartbeat_timeout
        # Frozen until a rule runs (see the module docstring); None: the real clock.
        self.clock = (
            trio.testing.MockClock(autojump_threshold=math.inf) if placement == "local" else None
        )
        self.app: App | None = None
        self.failure: SupervisorError | None = None  # the root gave up (or failed to start)
        self.crashed: BaseException | None = None  # the trio run itself raised
        self.stop_time = 0.0
        self.pids: dict[int, str] = {}  # worker processes seen: pid -> its start time
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self.ended: trio.Event | None = None
        self._thread = threading.Thread(
            target=self._thread_main, name=f"otpmesh-machine-{tree.id}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(wall_timeout):
            raise AssertionError(f"the app did not start within {wall_timeout:g} s")
        if self.crashed is not None:
            raise RuntimeError("the app's trio run failed while starting") from self.crashed

    def _thread_main(self) -> None:
        try:
            trio.run(self._main, clock=self.clock)
        except BaseException as exc:  # reported to the hypothesis thread by run() and close()
            self.crashed = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop, self.ended = trio.Event(), trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._host)
            await self._stop.wait()  # rules' tasks may still be sent after the app ended

    async def _host(self) -> None:
        assert self._stop is not None and self.ended is not None
        self._autojump(True)  # starting takes no time, but stop timeouts may need to fire
        try:
            async with start(
                self.tree, placement=self.placement, heartbeat_timeout=self.heartbeat_timeout
            ) as app:
                self.app = app
                self._autojump(False)
                self._ready.set()
                await self._stop.wait()
        except SupervisorError as exc:
            self.failure = exc  # the root gave up: the model predicts it, the machine compares
        finally:
            self.ended.set()
            self._ready.set()

    def _autojump(self, on: bool) -> None:
        if self.clock is not None:
            self.clock.autojump_threshold = 0 if on else math.inf

    def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` in the app's trio run (time moving), its result or exception here."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        async def task() -> None:
            self._autojump(True)
            try:
                future.set_result(await fn())
            except BaseException as exc:
                future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise  # Cancelled and friends belong to trio
            finally:
                self._autojump(False)

        if self._token is None or self._nursery is None or self.crashed is not None:
            raise RuntimeError("the app's trio run has ended") from self.crashed
        try:
            self._token.run_sync_soon(self._nursery.start_soon, task)
        except trio.RunFinishedError:
            raise RuntimeError("the app's trio run has ended") from self.crashed
        try:
            return future.result(self.wall_timeout)
        except concurrent.futures.TimeoutError:
            raise AssertionError(
                f"a step did not finish within {self.wall_timeout:g} s of wall-clock time: "
                "something in the app's trio run blocks without yielding"
            ) from None

    def close(self) -> None:
        """Stop the app (children in reverse start order) and end the run."""

        def begin_stop() -> None:
            assert self._stop is not None
            self.stop_time = trio.current_time()
            self._autojump(True)
            self._stop.set()

        if self._token is not None and self._thread.is_alive():
            try:
                self._token.run_sync_soon(begin_stop)
            except trio.RunFinishedError:
                pass
        self._thread.join(self.wall_timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the app did not stop within {self.wall_timeout:g} s")
        if self.crashed is not None:
            raise RuntimeError("the app's trio run failed") from self.crashed

    @property
    def live(self) -> App:
        if self.app is None:
            raise RuntimeError("the app failed to start") from self.failure
        return self.app

    async def exit_of(self, path: str, incarnation: int, logged: int) -> None:
        """Wait until the log shows this incarnation's exit (a SIGKILL is noticed some time
        after ``chaos.kill`` returns, and ``settled()`` cannot know one is coming), among the
        entries after the first `logged` (an owned subtree restarted with its owner counts
        incarnations from 1 again: an earlier subtree's exit is not this one)."""
        sup, _, child = path.rpartition("/")

        def seen(e: LogEntry) -> bool:
            return e.kind in _EXITS and (e.path, e.child, e.incarnation) == (
                sup,
                child,
                incarnation,
            )

        # No checkpoint between the look and the subscription: no entry can slip in between.
        if any(seen(e) for e in self.live.events._entries[logged:]) or self.gone():
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.cancel_when_ended, nursery.cancel_scope)
            entries = self.live.events.subscribe()
            try:
                async for entry in entries:
                    if seen(entry):
                        break
            finally:
                await entries.aclose()  # type: ignore[attr-defined]  # an async generator
            nursery.cancel_scope.cancel()

    async def settle(self) -> None:
        """Wait until the tree has no work pending, or the app has ended (the root gave up)."""
        assert self.ended is not None
        if not self.ended.is_set():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.cancel_when_ended, nursery.cancel_scope)
                await self.live.settled()
                nursery.cancel_scope.cancel()
        if self.gone():
            # The root gave up: let the app finish stopping (its processes too), so the next
            # step finds it fully stopped rather than halfway.
            await self.ended.wait()

    async def cancel_when_ended(self, scope: trio.CancelScope) -> None:
        assert self.ended is not None
        await self.ended.wait()
        scope.cancel()

    def gone(self) -> bool:
        """True once the root supervisor has exited (gave up, or failed to start)."""
        app = self.app
        return (self.ended is not None and self.ended.is_set()) or (
            app is not None and context(app).root.exited.is_set()
        )

    def incarnation(self, path: str) -> int | None:
        sup, _, child = path.rpartition("/")
        for e in reversed(self.live.events._entries):
            if e.kind == LogKind.CHILD_STARTED and (e.path, e.child) == (sup, child):
                return e.incarnation
        return None

    def holder(self, path: str) -> TreeContext | None:
        """The running tree that has `path` (the app's, or a subtree an actor owns)."""
        return context(self.live).holder(path)

    def record_pids(self, paths: Sequence[str]) -> None:
        """Note the worker processes of `paths` now (none may outlive the app)."""
        if self.placement != "procs" or self.app is None:
            return
        for path in paths:
            proc = self.process(path)
            if proc is not None and proc.pid:
                self.pids.setdefault(proc.pid, start_time(proc.pid))

    def process(self, path: str) -> Proc | None:
        """The live worker process that hosts `path` (None in-process, or when it has none)."""
        tree = self.holder(path)
        return tree.placement.process(tree.slot(path)) if tree is not None else None

    def orphans(self) -> list[int]:
        """The worker processes seen that outlive the app (none should: the fork server reaps
        or kills them all), after a grace of 5 s."""
        deadline = time.monotonic() + 5.0
        while True:
            living = [pid for pid, t in self.pids.items() if alive(pid, t)]
            if not living:
                return []
            if time.monotonic() > deadline:
                return living
            time.sleep(0.05)


async def now() -> float:
    return trio.current_time()


def start_time(pid: int) -> str:
    """A process's start time (field 22 of /proc/PID/stat): tells a pid from its reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return ""


def alive(pid: int, start_time: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == start_time
