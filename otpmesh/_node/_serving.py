"""What an actor is serving now, as its worker's watchdog thread reads it."""

from __future__ import annotations

import time


class Serving:
    """The endpoint an actor is running now, read by the worker's watchdog thread
    (_runtime/_watchdog.py): since when it last made progress, and how long it may go without."""

    __slots__ = ("deadline", "hung", "is_async", "method", "progress_at")

    def __init__(self, method: str, is_async: bool, deadline: float | None) -> None:
        self.method = method
        self.is_async = is_async
        self.deadline = deadline
        self.progress_at = time.monotonic()
        self.hung = False  # the watchdog found it past its deadline (and acts once)
