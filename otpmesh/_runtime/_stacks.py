"""Where a process's actors are now: the Python stacks of their endpoints and of its threads.

Read in the process itself, from any thread (the worker's watchdog thread, _watchdog.py, reads
them while the event loop is blocked in a plain-def endpoint). A plain-def endpoint runs on the
main thread, so its stack is the main thread's frames up to the actor's cell; an async endpoint
is a coroutine, so its stack is the chain of awaits from the endpoint down.

The text form, one frame a line, innermost first::

    MainThread:
      at spin (/app/actors.py:12)
          while True:

``Hung`` reasons and ``app.stacks()`` carry it; ``_core._exits.innermost_frame`` reads it back.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from types import FrameType
from typing import Any

from .._node._aioloop import THREAD_NAME as ASYNCIO_THREAD

# Frames of the cell (and trio's, below an await) are the machinery around an endpoint.
_CELL_FILE = os.path.join("otpmesh", "_node", "_cell.py")
# A blocking endpoint's thread: its frames below the function that runs it there.
_BLOCKING_FILE = os.path.join("otpmesh", "_node", "_blocking.py")
#: Most frames shown per stack (the innermost ones).
MAX_FRAMES = 40


def _is_trio(frame: FrameType) -> bool:
    return f"{os.sep}trio{os.sep}" in frame.f_code.co_filename


def format_frames(frames: Iterable[FrameType]) -> list[str]:
    """'at func (file:line)' lines, each followed by its source line, innermost first."""
    lines: list[str] = []
    for frame in frames:
        code = frame.f_code
        lines.append(f"  at {code.co_name} ({code.co_filename}:{frame.f_lineno})")
        source = linecache.getline(code.co_filename, frame.f_lineno).strip()
        if source:
            lines.append(f"      {source}")
    return lines


def _outward(frame: FrameType | None) -> list[FrameType]:
    frames: list[FrameType] = []
    while frame is not None and len(frames) < 4 * MAX_FRAMES:
        frames.append(frame)
        frame = frame.f_back
    return frames


def endpoint_frames_sync(main: FrameType | None) -> list[FrameType]:
    """A plain-def endpoint's frames, innermost first: the main thread's, up to the cell (or
    a blocking endpoint's thread's, up to the function that runs it there)."""
    frames = _outward(main)
    for i, frame in enumerate(frames):
        code = frame.f_code
        if code.co_filename.endswith((_CELL_FILE, _BLOCKING_FILE)):
            frames = frames[:i]
            break
    return frames[:MAX_FRAMES]


def endpoint_frames_async(coro: Any) -> list[FrameType]:
    """An async endpoint's frames, innermost first: the awaits below the cell, trio's own
    frames at the bottom left out."""
    chain: list[FrameType] = []
    while coro is not None and len(chain) < 4 * MAX_FRAMES:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        chain.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    last_cell = max(
        (i for i, f in enumerate(chain) if f.f_code.co_filename.endswith(_CELL_FILE)), default=-1
    )
    chain = chain[last_cell + 1 :]
    while chain and _is_trio(chain[-1]):
        chain.pop()
    return list(reversed(chain))[:MAX_FRAMES]


def actor_stack(cell: Any, first: Any = None) -> str:
    """What one actor is doing now, as text: each call it serves (the serial one, those of
    its concurrent endpoints in flight; `first` first) and where, or 'idle'."""
    servings = cell.servings()
    if first is not None and first in servings:
        servings.remove(first)
        servings.insert(0, first)
    if not servings:
        return "idle"
    return "\n".join(_call_stack(cell, serving) for serving in servings)


def _call_stack(cell: Any, serving: Any) -> str:
    if serving.is_async:
        # An asyncio actor's endpoint is its asyncio task (_node/_aioloop.py); a trio one's
        # is its own task (a concurrent call's) or the cell's.
        aio, task = serving.aio_task, serving.task or cell.task
        coro = aio.get_coro() if aio is not None else task.coro if task is not None else None
        frames = endpoint_frames_async(coro)
        kind = "concurrent endpoint" if serving.task is not None else "async endpoint"
    else:
        # A blocking endpoint runs in a worker thread; a plain def, on the main thread.
        thread = serving.thread or threading.main_thread().ident or 0
        frames = endpoint_frames_sync(sys._current_frames().get(thread))
        kind = "blocking endpoint" if serving.thread else "endpoint"
    body = format_frames(frames) or ["  (no Python frames: in C code)"]
    return "\n".join([f"{kind} {serving.method}:", *body])


def thread_stacks(skip: Iterable[int] = ()) -> str:
    """Every thread's stack but the main thread's and those in `skip`, innermost first."""
    skipped = {*skip, threading.main_thread().ident}
    names = {t.ident: t.name for t in threading.enumerate()}
    out: list[str] = []
    for ident, frame in sys._current_frames().items():
        if ident in skipped or (names.get(ident) == ASYNCIO_THREAD and _waiting(frame)):
            continue  # an asyncio loop waiting for work: its actors' stacks say the rest
        frames = _outward(frame)[:MAX_FRAMES]
        out.append(f"thread {names.get(ident, ident)}:")
        out.extend(format_frames(frames))
    return "\n".join(out)


def _waiting(frame: FrameType) -> bool:
    """Whether a loop's thread is in its selector's wait."""
    return frame.f_code.co_name in ("select", "poll") and frame.f_code.co_filename.endswith(
        "selectors.py"
    )


def snapshot(cells: Mapping[str, Any], skip_threads: Iterable[int] = ()) -> dict[str, Any]:
    """The stacks of every actor in `cells` (path -> cell) and of the other threads."""
    return {
        "pid": os.getpid(),
        "actors": {path: actor_stack(cell) for path, cell in cells.items()},
        "threads": thread_stacks(skip_threads),
    }
