"""``otpmesh.run``: run an async main under trio with otpmesh's shutdown behaviour."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")

# Set in worker processes: there, importing the controller's main file must not start a program.
IN_WORKER = False


def _only_interrupts(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_interrupts(e) for e in exc.exceptions)
    return isinstance(exc, KeyboardInterrupt | trio.Cancelled)


def run(main: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run `main(*args)` under trio. Workers never outlive it; Ctrl-C stops everything with one
    short message and exit status 130; a supervision tree that gives up exits with status 1 and
    a message naming the supervisor and the last exit reasons."""
    if IN_WORKER:
        from .._core._errors import SpawnError

        raise SpawnError(
            "otpmesh.run() was called while a worker imported the controller's main file to find "
            'an actor class; guard the entry point with:\n    if __name__ == "__main__":\n'
            "        otpmesh.run(main)"
        )
    from .._core._errors import SupervisorError

    try:
        return trio.run(main, *args)
    except SupervisorError as exc:
        # The tree gave up: its error already says where and why; no traceback pile.
        print(f"otpmesh: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) or (
            isinstance(exc, BaseExceptionGroup) and _only_interrupts(exc)
        ):
            print("otpmesh: interrupted, all actors stopped", file=sys.stderr)
            raise SystemExit(130) from None
        raise
