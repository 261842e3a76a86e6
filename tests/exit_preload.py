"""Imported by a fork server (OTPMESH_PRELOAD) in tests/test_exit_functions.py: an atexit
function and a finalizer registered in the server, before any worker is forked."""

from __future__ import annotations

import atexit
import os
import weakref

from tests.ending_actors import write_marker

_DIR = os.environ["OTPMESH_TEST_EXIT_DIR"]


class _Resource:
    pass


RESOURCE = _Resource()  # lives as long as the process
atexit.register(lambda: write_marker(f"{_DIR}/server-atexit-{os.getpid()}"))
weakref.finalize(RESOURCE, write_marker, f"{_DIR}/server-finalizer-{os.getpid()}")
