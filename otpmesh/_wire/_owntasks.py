"""otpmesh's own background tasks, and whether a stop signal landed in one of them.

trio turns Ctrl-C into a ``KeyboardInterrupt`` raised in whatever unprotected code is running
when the signal arrives. A system task is protected at its top only: the tasks it starts in its
nurseries (the runtime's connections, supervisors, host links) are not, so an interrupt could
land in the middle of a frame being read and tear the runtime down before it stopped the tree
in order. Every system task otpmesh starts goes through `spawn`, and the stop-signal handlers hand
the signal to trio through `interrupt`, which withholds the frame from trio there: trio then
delivers the interrupt to the program's main task at its next checkpoint, whose cancellation
stops the tree in order.
"""

from __future__ import annotations

import contextvars
import signal
import weakref
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

import trio

_OWN: weakref.WeakSet[trio.lowlevel.Task] = weakref.WeakSet()


def spawn(
    fn: Callable[..., Awaitable[object]],
    *args: Any,
    name: str,
    context: contextvars.Context | None = None,
) -> trio.lowlevel.Task:
    """``trio.lowlevel.spawn_system_task``, the task (and every task under it) marked otpmesh's."""
    task = trio.lowlevel.spawn_system_task(fn, *args, name=name, context=context)
    _OWN.add(task)
    return task


def in_own_task() -> bool:
    """Whether the code running now is one of otpmesh's system tasks' or a task under one (False
    outside any task: trio's own code is protected and decides for itself)."""
    try:
        task: trio.lowlevel.Task | None = trio.lowlevel.current_task()
    except RuntimeError:
        return False
    while task is not None:
        if task in _OWN:
            return True
        nursery = task.parent_nursery
        task = None if nursery is None else nursery.parent_task
    return False


def interrupt(
    trio_handler: Callable[[int, FrameType | None], object], frame: FrameType | None
) -> None:
    """Hand a stop signal to trio's SIGINT handler as Ctrl-C: a ``KeyboardInterrupt`` where it
    landed (`frame`) in the program's own code; in otpmesh's own tasks the frame is withheld,
    and trio interrupts main at its next checkpoint instead."""
    trio_handler(signal.SIGINT, None if in_own_task() else frame)
