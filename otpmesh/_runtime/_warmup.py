"""The actor a spare worker starts, calls once and stops while it waits for its process.

A forked worker shares the fork server's memory until it writes to it, then pays a page fault
and a copy for each page it writes first (a reference count is a write: code writes to the
objects it runs). A spare has run its event loop and dialed its controller, but not the path a
restart takes next: a module imported by name, an actor constructed, its cell and task, a call
dispatched and answered, a stop. So it runs that path once on this actor, otpmesh's own (a
spare runs no user code: ``_spare.py``), off the restart's critical path
(``Worker._warm_up``). This module is imported there by name, never by the fork server, so its
import is a real one.
"""

from __future__ import annotations

from typing import Any

from .._core._actor import Actor, endpoint

#: The calls this process's warm-up answered (2 once it ran through: what its test reads).
answered = 0


class Warmup(Actor):
    """Started, called once and stopped in a spare worker before it is handed a process."""

    @endpoint
    def echo(self, x: Any) -> Any:
        global answered
        answered += 1
        return x

    @endpoint
    async def echo_awaiting(self, x: Any) -> Any:
        global answered
        answered += 1
        return x
