"""Whom a worker may signal: each worker is a Landlock domain of its own (Linux 6.12+).

Any process may signal another of the same user (and root, with ``CAP_KILL``, any process), so
a compromised actor could once SIGKILL its controller (the app ends) or SIGSTOP it (everything
hangs), and do the same to its fork server, its sibling workers and a host agent. A worker now
restricts itself right after its fork, before any code but otpmesh's runs in it
(``confine_worker``): with Landlock's ``LANDLOCK_SCOPE_SIGNAL`` it may signal only the
processes of its own domain, itself and the children it forks later, and the kernel refuses
every other ``kill``, ``pidfd_send_signal`` and ``tgkill`` with ``EPERM``, whatever the
worker's capabilities. The signals the kernel sends on its own account are not sends: a
worker's exit still tells its fork server (``SIGCHLD``), and its parent-death signal still
reaches it. Signals *to* workers are the controller's, the fork server's and the command
line's (``otpmesh stacks``), none of them confined. The ruleset handles no file or network
access (``handled_access_fs`` and ``handled_access_net`` are 0): nothing else is restricted.

Two things come with a domain, whatever it handles:

- **ptrace scope.** A process in a domain may not ptrace, ``process_vm_readv``/``writev``,
  ``pidfd_getfd`` or read ``/proc/PID/mem`` of a process outside it. So no actor reads a
  sibling's memory any more; the ``shm`` backend's direct copies between two workers no longer
  reach (the controller and a host agent are outside every domain, so they still copy to and
  from a worker, rdma/_shm.py). Values of 32 MiB and more in messages are mapped from passed
  descriptors as before; smaller ones and ``RDMABuffer`` reads between workers take ``tcp``.
- **No new privileges.** Only a process with ``CAP_SYS_ADMIN`` may enter a domain without
  ``PR_SET_NO_NEW_PRIVS``; any other worker sets it first. Then a program it runs gains nothing
  from a setuid bit or file capabilities (``sudo``, ``su``, a setuid ``ping``), as in a
  ``systemd`` service with ``NoNewPrivileges=yes``. A root worker with ``CAP_SYS_ADMIN`` keeps
  them.

Abstract Unix sockets are not scoped (``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET``): that scope
refuses a *connect* to a socket that a process outside the domain bound, and a worker connects
to its controller's abstract socket and to its siblings' (actors call each other directly).
The app's secret is what keeps strangers off those sockets (docs/security.md).

``OTPMESH_SANDBOX=0`` in the controller's environment leaves the workers unconfined; like
``OTPMESH_DUMPABLE`` it is read when a mesh's processes are spawned (the controller hands its
``OTPMESH_*`` settings to each). A kernel without the scope (Landlock ABI below 6, Landlock
disabled, not Linux) confines nothing, and the app says so once at start (``warning``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Mapping
from typing import Any

#: Set to 0 to leave the workers free to signal any process their user may (a job that signals
#: its controller on purpose; direct ``shm`` copies between workers; setuid helpers run as a
#: user without CAP_SYS_ADMIN). Read in the worker as it is forked, from its mesh's settings.
ENV = "OTPMESH_SANDBOX"

# <linux/landlock.h>
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
LANDLOCK_SCOPE_SIGNAL = 1 << 1
#: The first Landlock ABI with scopes (Linux 6.12).
SCOPE_ABI = 6
_PR_SET_NO_NEW_PRIVS = 38


class _RulesetAttr(ctypes.Structure):
    """``struct landlock_ruleset_attr`` as of ABI 6: three __u64, in this order."""

    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


try:
    _libc: Any = ctypes.CDLL(None, use_errno=True)
    _libc.syscall.restype = ctypes.c_long
except (OSError, AttributeError):  # pragma: no cover - not a Unix libc
    _libc = None

#: Whether this process entered a worker's domain (set in the forked worker, and inherited by
#: the processes it forks, which are in that domain too).
_confined = False


def _syscall(number: int, *args: Any) -> int:
    """The syscall's result, or minus its errno."""
    ctypes.set_errno(0)
    result = int(_libc.syscall(number, *args))
    return -ctypes.get_errno() if result < 0 else result


def abi() -> int:
    """This kernel's Landlock ABI version; 0 where it has none (too old, disabled at boot,
    refused by a seccomp filter, not Linux)."""
    if _libc is None or not sys.platform.startswith("linux"):
        return 0
    version = _syscall(
        _SYS_LANDLOCK_CREATE_RULESET,
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(version, 0)


def unavailable() -> str | None:
    """Why this kernel cannot confine a worker's signals, or None when it can."""
    if _libc is None or not sys.platform.startswith("linux"):
        return "not Linux: no Landlock"
    version = abi()
    if version == 0:
        return "this kernel has no Landlock (before Linux 5.13, not enabled at boot, or refused)"
    if version < SCOPE_ABI:
        return f"this kernel's Landlock is ABI {version}; scoping signals needs ABI 6 (Linux 6.12)"
    return None


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether workers are to be confined: ``OTPMESH_SANDBOX`` is not 0 in `env` (default: this
    process's environment)."""
    return (os.environ if env is None else env).get(ENV, "1").strip() != "0"


def confined() -> bool:
    """Whether this process is a confined worker (or a process a confined worker forked)."""
    return _confined


def confine_worker() -> bool:
    """In a forked worker, while it has one thread (a domain binds the calling thread only):
    enter a Landlock domain of its own that scopes signals. True once confined; False where
    ``OTPMESH_SANDBOX=0`` or the kernel has no such scope (the app said so at start: ``warning``);
    OSError where the kernel has it and refused."""
    global _confined
    if not wanted() or unavailable() is not None:
        return False
    attr = _RulesetAttr(0, 0, LANDLOCK_SCOPE_SIGNAL)
    ruleset = _syscall(
        _SYS_LANDLOCK_CREATE_RULESET,
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
        ctypes.c_uint32(0),
    )
    if ruleset < 0:
        raise OSError(-ruleset, f"landlock_create_ruleset: {os.strerror(-ruleset)}")
    try:
        done = _syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0))
        if done == -errno.EPERM:  # no CAP_SYS_ADMIN: entering a domain needs no_new_privs
            if _libc.prctl(_PR_SET_NO_NEW_PRIVS, *map(ctypes.c_ulong, (1, 0, 0, 0))) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
            done = _syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0))
        if done < 0:
            raise OSError(-done, f"landlock_restrict_self: {os.strerror(-done)}")
    finally:
        os.close(ruleset)
    _confined = True
    return True


def warning() -> str | None:
    """What to say once, where an app starts its workers, when they will not be confined
    although nobody asked for that: None when they will be (or ``OTPMESH_SANDBOX=0``)."""
    if not wanted():
        return None
    why = unavailable()
    if why is None:
        return None
    return (
        f"workers are not sandboxed: {why}. A compromised actor can signal every process of "
        "this user (SIGKILL or SIGSTOP its controller, fork server, sibling workers, host "
        f"agent); docs/security.md. Set {ENV}=0 to silence this"
    )


_warned = False


def warning_once() -> str | None:
    """``warning``, the first time this process asks (it starts one fork server per run, and
    each would say the same); None after that."""
    global _warned
    line = None if _warned else warning()
    _warned = _warned or line is not None
    return line
