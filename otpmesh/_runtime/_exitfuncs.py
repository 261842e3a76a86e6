"""A worker's exit functions: which of them run when it ends, and for how long.

A worker that ends in order (its parent asked it to shut down: ``ProcMesh.stop()``, an app's
stop, or its controller went away) exits as a Python program does: its ``atexit`` functions
run, and with them the ``weakref.finalize`` finalizers still pending (those with ``atexit``
set), then the globals of the modules it imported itself are cleared, so that the objects they
held are finalized (``__del__``), all for at most EXIT_GRACE seconds, after which it exits
anyway. A worker killed outright
(SIGKILL, a stop past its timeout) runs nothing, as any killed process.

A worker is forked from a pre-warmed fork server, so it starts with what the server registered
while it imported torch, otpmesh and the OTPMESH_PRELOAD modules. Measured with torch 2.13:
six atexit functions (logging's flush, multiprocessing's, two of torch's, pybind11's, and
``weakref.finalize``'s own), each about the state of the process it runs in, so a worker runs
them as any process that imported those modules would; and 134 finalizers (torch's libraries),
each tied to an object the server made. A finalizer is about its object's resources (a
temporary directory made at import is removed by one): those of the server's objects are the
server's, so a worker disarms them when it is forked (``disown_finalizers``) and runs only the
finalizers of objects it made itself.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
import weakref

#: Seconds a worker's exit functions may take before it exits without them.
EXIT_GRACE = 1.0


#: The modules the fork server had imported (set in a freshly forked worker): those imported
#: after are the worker's own, whose globals it clears at exit as Python's finalization does.
_server_modules: frozenset[str] | None = None


def disown_finalizers() -> None:
    """In a freshly forked worker: the finalizers pending now are its fork server's (see the
    module docstring); none of them runs when this process exits."""
    global _server_modules
    _server_modules = frozenset(sys.modules)
    # weakref keeps its pending finalizers in a class-level registry; there is no public way
    # to list them (each one's ``atexit`` flag is public).
    for finalizer in list(getattr(weakref.finalize, "_registry", {})):
        finalizer.atexit = False


def run_exit_functions(code: int, grace: float = EXIT_GRACE) -> None:
    """Run this process's atexit functions (and with them its pending finalizers); exit with
    `code` anyway if they take more than `grace` seconds."""
    run = getattr(atexit, "_run_exitfuncs", None)  # CPython's: what interpreter exit runs
    if run is None:
        return
    deadline = threading.Timer(grace, _exit_now, (code, grace))
    deadline.daemon = True
    deadline.start()
    try:
        run()
        finalize_own_modules()
    finally:
        deadline.cancel()


def finalize_own_modules() -> None:
    """Clear the globals of the modules this worker imported itself (the user's: its actors'),
    newest first, as Python's finalization does (names with one leading underscore first, then
    the rest), so that what they hold is collected and its ``__del__`` runs, as in a Python
    program that exits. The fork server's modules are its own, and stay."""
    if _server_modules is None:
        return
    own = [m for name, m in list(sys.modules.items()) if name not in _server_modules]
    for module in reversed(own):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for first in (True, False):
            for name in list(namespace):
                private = name.startswith("_") and not name.startswith("__")
                if private == first and name != "__builtins__":
                    namespace[name] = None
    gc.collect()


def _exit_now(code: int, grace: float) -> None:
    print(
        f"otpmesh worker {os.getpid()}: exit functions still running after {grace:g} s; "
        "exiting without them",
        file=sys.stderr,
        flush=True,
    )
    os._exit(code)
