"""Monarch's ``unhandled_fault_hook``: what happens when a mesh the program (the client)
spawned fails and nobody owns it to handle it.

Monarch calls ``monarch.actor.unhandled_fault_hook(failure)``; by default it exits the program
(``sys.exit(1)``). A hook that raises leaves the fault unhandled, and the program ends: one line
on stderr names the actor, its rank and why, and the program's main thread is interrupted so
that it ends with its ``finally`` blocks and ``atexit`` functions run, with the hook's exit
status (1 for the default hook; ``_ending.py`` says how). Set
``otpmesh.monarch.unhandled_fault_hook`` to log or ignore instead.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from .._node._failure import MeshFailure
from .._runtime._controller_runtime import Runtime
from ._ending import end_program, ending_status
from ._supervision import MonarchFailure

#: What the line that ends the program starts with.
ENDS = "otpmesh.monarch: unhandled fault, the program ends:"


def default_hook(failure: MeshFailure) -> None:
    """Monarch's default: the fault ends the program."""
    sys.exit(1)


def report(failure: MeshFailure) -> None:
    """Give `failure` to the program's hook (read at each fault: users replace it); a hook that
    raises ends the program. Once it is ending, later faults are not reported again."""
    if ending_status() is not None:
        return
    hook: Any = getattr(sys.modules[__package__ or ""], "unhandled_fault_hook", default_hook)
    try:
        hook(MonarchFailure.of(failure))
    except BaseException as exc:
        # One line: the worker's own log already showed the traceback of what failed there.
        what = str(failure).splitlines()[0]
        why = "" if isinstance(exc, SystemExit) else f" (its hook raised {exc!r})"
        print(f"{ENDS} {what}{why}", file=sys.stderr, flush=True)
        end_program(_exit_status(exc))


def _exit_status(exc: BaseException) -> int:
    """The status `exc` ends the program with, as Python would: SystemExit's code, else 1."""
    if isinstance(exc, SystemExit):
        code = exc.code
        return code if isinstance(code, int) else 0 if code is None else 1
    return 1


_listening: weakref.WeakSet[Runtime] = weakref.WeakSet()


def listen(rt: Runtime) -> None:
    """Report the unowned failures of runtime `rt` (once per runtime)."""
    if rt not in _listening:
        _listening.add(rt)
        rt.unowned_failures.append(report)
