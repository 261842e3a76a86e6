"""Blocking endpoints (``@endpoint(blocking=True)``): a plain def run in a worker thread.

A plain def runs on the event loop's thread, so one that blocks (``time.sleep``, I/O, a call
to another actor from synchronous code) stalls its whole process. A blocking one runs in a
worker thread instead, still one call at a time (the cell waits for it), in the cell task's
context: the actor's context, and the call chain, so a call it makes through
``trio.from_thread.run`` (which runs in the node's trio run, in that context) is still refused
when it would wait on itself. ``Actor.stop`` and ``otpmesh.progress()`` work from the thread.

A thread cannot be interrupted: its caller giving up leaves it running to its end; a kill or a
crash of the actor abandons it (it runs on unseen, its result dropped); at its progress
deadline its process is killed, as for a blocked plain def (_runtime/_watchdog.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import trio

from .._core._actor import ActorContext, set_context
from ._serving import Serving


async def run_blocking(
    ctx: ActorContext,
    serving: Serving,
    request_stop: Callable[[object], None],
    fn: Callable[..., Any],
    args: list[Any],
    kwargs: dict[str, Any],
) -> Any:
    """Run ``fn(*args, **kwargs)`` in a worker thread for the call `serving`; return its value."""
    token = trio.lowlevel.current_trio_token()

    def stop(reason: object) -> None:
        # Run in trio before the endpoint's return is seen there: the actor stops after it.
        trio.from_thread.run_sync(request_stop, reason, trio_token=token)

    def in_thread() -> Any:
        serving.thread = threading.get_ident()  # where its stack is read
        set_context(ctx, stop, serving.mark)
        try:
            return fn(*args, **kwargs)
        finally:
            serving.thread = None

    return await trio.to_thread.run_sync(in_thread, abandon_on_cancel=True)
