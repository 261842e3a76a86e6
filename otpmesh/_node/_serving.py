"""What an actor is serving now, as its worker's watchdog thread reads it."""

from __future__ import annotations

import math
import time
from typing import Any


class Serving:
    """The endpoint an actor is running now, read by the worker's watchdog thread
    (_runtime/_watchdog.py): since when it last made progress, and how long it may go without."""

    __slots__ = ("aio_task", "deadline", "hung", "is_async", "method", "progress_at")

    def __init__(self, method: str, is_async: bool, deadline: float | None) -> None:
        self.method = method
        self.is_async = is_async
        self.deadline = deadline
        self.progress_at = time.monotonic()
        self.hung = False  # the watchdog found it past its deadline (and acts once)
        self.aio_task: Any = None  # an asyncio actor's: the asyncio task running the endpoint


def chaos_wedge(seconds: float | None) -> None:
    """otpmesh.chaos.wedge: block the actor's thread here, as a wedged endpoint does (its stack
    shows this function), for `seconds` or for ever."""
    end = math.inf if seconds is None else time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
