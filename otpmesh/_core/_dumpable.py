"""Whether other processes of this user may read this one's memory (Linux's "dumpable" flag).

A dumpable process's memory is open to any process of the same user (``/proc/PID/mem``,
``process_vm_readv``, ``pidfd_getfd``, ptrace), a compromised actor included. The controller and
the host agents hold what no actor needs (the app's secret, every actor's constructor arguments,
the supervision state), so they clear the flag at start (``make_undumpable``): then only root
(``CAP_SYS_PTRACE``) reads them. The flag is inherited across ``fork`` and reset by ``execve``:
the fork server and the workers it forks start from a fresh interpreter and stay dumpable, so
the ``shm`` backend still copies between workers (docs/security.md, docs/rdma.md).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3
#: Set to 1 to leave the controller and agents dumpable (a debugger or py-spy of this user,
#: not root, needs it), or to 0 to make the workers non-dumpable too (untrusted actor code:
#: no actor reads another; the shm backend then falls back, docs/security.md).
ENV = "OTPMESH_DUMPABLE"


try:
    _libc_prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: nothing to set, nothing to ask
    _libc_prctl = None


def _prctl(option: int, arg: int = 0) -> int:
    if _libc_prctl is None:
        return -1
    return int(_libc_prctl(option, arg, 0, 0, 0))


def dumpable() -> bool:
    """Whether processes of this user may read this process's memory (True where not Linux:
    nothing here says otherwise)."""
    return _prctl(_PR_GET_DUMPABLE) != 0


def make_undumpable() -> None:
    """Clear this process's dumpable flag, unless ``OTPMESH_DUMPABLE=1`` asks to keep it."""
    if os.environ.get(ENV) != "1":
        _prctl(_PR_SET_DUMPABLE, 0)


def isolate_worker() -> None:
    """In a worker: clear its dumpable flag when ``OTPMESH_DUMPABLE=0`` asks for isolated
    actors (a compromised actor then cannot read its siblings either)."""
    if os.environ.get(ENV) == "0":
        _prctl(_PR_SET_DUMPABLE, 0)
