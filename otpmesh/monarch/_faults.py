"""Monarch's ``unhandled_fault_hook``: what happens when a mesh the program (the client)
spawned fails and nobody owns it to handle it.

Monarch calls ``monarch.actor.unhandled_fault_hook(failure)``; by default it exits the program
(``sys.exit(1)``), and a hook that raises leaves the fault unhandled: the program's main thread
is interrupted (KeyboardInterrupt), as Monarch does, so it ends with its ``finally`` blocks and
``atexit`` functions run. Set ``otpmesh.monarch.unhandled_fault_hook`` to log or ignore instead.
"""

from __future__ import annotations

import _thread
import logging
import sys
import weakref
from typing import Any

from .._node._failure import MeshFailure
from .._runtime._controller_runtime import Runtime

log = logging.getLogger("otpmesh.monarch")


def default_hook(failure: MeshFailure) -> None:
    """Monarch's default: the fault ends the program."""
    sys.exit(1)


def report(failure: MeshFailure) -> None:
    """Give `failure` to the program's hook (read at each fault: users replace it)."""
    hook: Any = getattr(sys.modules[__package__ or ""], "unhandled_fault_hook", default_hook)
    try:
        hook(failure)
    except BaseException as exc:
        log.critical("unhandled fault, the program ends: %s (%r)", failure, exc)
        _thread.interrupt_main()


_listening: weakref.WeakSet[Runtime] = weakref.WeakSet()


def listen(rt: Runtime) -> None:
    """Report the unowned failures of runtime `rt` (once per runtime)."""
    if rt not in _listening:
        _listening.add(rt)
        rt.unowned_failures.append(report)
