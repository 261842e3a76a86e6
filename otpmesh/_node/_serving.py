"""What an actor is serving now, as its worker's watchdog thread reads it."""

from __future__ import annotations

import math
import time
from typing import Any


class Serving:
    """One call an actor is running now, read by the worker's watchdog thread
    (_runtime/_watchdog.py): since when it last made progress, and how long it may go without.
    An actor serves one call at a time, plus those of its concurrent endpoints in flight."""

    __slots__ = (
        "aio_task",
        "deadline",
        "hung",
        "is_async",
        "method",
        "progress_at",
        "reply",
        "scope",
        "task",
        "thread",
    )

    def __init__(self, method: str, is_async: bool, deadline: float | None) -> None:
        self.method = method
        self.is_async = is_async
        self.deadline = deadline
        self.progress_at = time.monotonic()
        self.hung = False  # the watchdog found it past its deadline (and acts once)
        self.aio_task: Any = None  # an asyncio actor's: the asyncio task running the endpoint
        # A concurrent call's own trio task (None: the cell's), and a blocking endpoint's
        # thread while it runs there: where its stack is read (_runtime/_stacks.py).
        self.task: Any = None
        self.thread: int | None = None
        # A concurrent call's: where its reply goes, and the scope its caller's cancel cancels.
        self.reply: Any = None
        self.scope: Any = None

    def mark(self) -> None:
        """otpmesh.progress() for this call: its deadline starts again."""
        self.progress_at = time.monotonic()


def chaos_wedge(seconds: float | None) -> None:
    """otpmesh.chaos.wedge: block the actor's thread here, as a wedged endpoint does (its stack
    shows this function), for `seconds` or for ever."""
    end = math.inf if seconds is None else time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)


class Starting:
    """An actor being started (its constructor, ``on_start``, a heal), as the watchdog reads
    it: one serving, named ``__init__``, under the child spec's progress deadline (which
    ``otpmesh.progress()`` in the constructor starts again), and a start timeout counted from
    the start's beginning that nothing extends. Past either, the start is hung: an async
    ``on_start`` is cancelled (``cancel``, on the loop), a constructor that holds the loop
    ends with its process."""

    __slots__ = (
        "done",
        "hung",
        "incarnation",
        "path",
        "reason",
        "scope",
        "serving",
        "task",
        "until",
    )

    def __init__(
        self, path: str, incarnation: int, deadline: float | None, timeout: float | None
    ) -> None:
        self.path = path
        self.incarnation = incarnation
        self.serving = Serving("__init__", False, deadline)
        self.until = math.inf if timeout is None else self.serving.progress_at + timeout
        self.scope: Any = None  # the trio cancel scope the start runs in
        self.task: Any = None  # the trio task running it (an async on_start's stack)
        self.reason: Any = None  # the Hung the watchdog found, once it found one
        self.hung = False
        self.done = False

    def expiry(self) -> float:
        """When it is hung unless it ends or makes progress first."""
        serving = self.serving
        deadline = math.inf if serving.deadline is None else serving.progress_at + serving.deadline
        return min(deadline, self.until)

    def why(self, now: float) -> tuple[float, str]:
        """(the seconds it went without progress, what ran out) once it is hung at `now`."""
        serving = self.serving
        if now >= self.until:
            return now - serving.progress_at, "did not start within its start_timeout"
        return now - serving.progress_at, "ran past its progress deadline while starting"

    # The watchdog reads a start as it reads an actor's cell (_runtime/_stacks.py).
    def servings(self) -> list[Serving]:
        return [] if self.done else [self.serving]

    def cancel(self, reason: Any) -> None:
        """On the loop: end an async start with `reason` (its ``on_start`` is cancelled)."""
        if not self.done and self.scope is not None:
            self.reason = reason
            self.scope.cancel()
