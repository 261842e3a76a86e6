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
