"""A worker's death, seen before the kernel tears its memory down (a robust futex).

A dying process's files close (socket EOF, pidfd readable) only after its address space is torn
down: 13 ms or more for a process forked from a torch-preloaded server (docs/architecture.md,
"Where a SIGKILL's restart goes"). Its robust-futex list is walked before that, in
``exit_mm_release``: every robust lock its threads hold is marked FUTEX_OWNER_DIED and one waiter
is woken. So each worker holds one: a glibc robust, process-shared mutex in a page of its own (a
memfd the controller made), taken by its main thread at start and never released; the controller
waits on the lock's word. Measured (spike/robust_futex_spike.py): the wake comes first in every
kill, 1.4 to 2.5 ms after it at load 10 to 14, the EOF 58 to 118 ms.

The page is writable by the worker, so the controller trusts nothing in it:
- one page per worker, so a worker can change only its own word: it can make itself look
  dying, never a sibling (and whoever acts on "dying" kills that worker first: self-harm only);
- the controller maps it read-only and never takes the mutex with glibc: glibc links a held
  robust mutex into the taker's robust list through pointers stored *in the mutex*, which the
  worker could rewrite into writes anywhere in the controller. It waits on the word with
  ``futex_waitv`` (one thread for up to ``_PER_THREAD`` workers) and reads it, nothing more;
- the wake means "dying", not why: a normal exit and an ``exec`` release the lock the same way.
  The exit status still comes from the pidfd or the fork server.

The worker sets FUTEX_WAITERS in its own word once it holds the lock (the kernel wakes a waiter
only when it is set; nobody else writes the word while the worker lives, so a plain store does).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import threading
import time
from collections.abc import Callable

_PAGE = 4096
_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1
_FUTEX_WAITERS = 0x80000000
_FUTEX_OWNER_DIED = 0x40000000
_FUTEX_TID_MASK = 0x3FFFFFFF
_FUTEX_WAKE = 1
_FUTEX2_SIZE_U32 = 0x02
# The watcher's own control word is private: keyed as shared, its wakes were lost once the
# process had forked (stop() hung in the test suite until this and the backstop).
_FUTEX_PRIVATE = 128
_SYS_FUTEX_WAITV = 449  # x86_64 and aarch64 alike
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_CLOCK_MONOTONIC = 1
#: Words one futex_waitv call waits on: the kernel's limit (128), less this thread's own word.
_PER_THREAD = 127
# How long a watcher thread waits before it looks again unwoken (seconds).
_BACKSTOP = 1.0
#: At most this many watcher threads (127 workers each); workers beyond are left to the EOF.
MAX_THREADS = 8

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _Waitv(ctypes.Structure):
    _fields_ = [
        ("val", ctypes.c_uint64),
        ("uaddr", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


def available() -> bool:
    """Whether this kernel and libc have what the death lock needs (else: the EOF path only)."""
    return (
        _SYS_FUTEX is not None
        and hasattr(os, "memfd_create")
        and hasattr(_libc, "pthread_mutexattr_setrobust")
    )


def new_page() -> int:
    """A fresh page for one worker's lock (a memfd, close-on-exec): pass it to the worker."""
    fd = os.memfd_create("otpmesh-deathlock", os.MFD_CLOEXEC)
    os.ftruncate(fd, _PAGE)
    return fd


_held: list[mmap.mmap] = []  # the worker's mapping, alive as long as the process


def hold(fd: int) -> None:
    """In the worker's main thread: take the lock in page `fd` for the rest of its life."""
    page = mmap.mmap(fd, _PAGE, mmap.MAP_SHARED)
    os.close(fd)
    addr = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    attr = ctypes.create_string_buffer(64)
    for rc in (
        _libc.pthread_mutexattr_init(attr),
        _libc.pthread_mutexattr_setpshared(attr, _PTHREAD_PROCESS_SHARED),
        _libc.pthread_mutexattr_setrobust(attr, _PTHREAD_MUTEX_ROBUST),
        _libc.pthread_mutex_init(addr, attr),
        _libc.pthread_mutex_lock(addr),
    ):
        if rc != 0:
            raise OSError(rc, os.strerror(rc))
    word = ctypes.c_uint32.from_buffer(page)  # __lock: the first word of glibc's mutex
    word.value |= _FUTEX_WAITERS
    _held.append(page)


def holding() -> bool:
    """Whether this process holds its death lock (``hold`` succeeded)."""
    return bool(_held)


class _Watch:
    """One worker's page, mapped read-only here (libc's mmap: Python's refuses an address)."""

    __slots__ = ("addr", "dying", "key")

    def __init__(self, fd: int, key: object, dying: Callable[[object], None]) -> None:
        addr = _libc.mmap(None, _PAGE, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap of a death lock page failed")
        self.addr: int = addr
        self.key = key
        self.dying = dying

    def word(self) -> int:
        return ctypes.c_uint32.from_address(self.addr).value

    def unmap(self) -> None:
        _libc.munmap(ctypes.c_void_p(self.addr), _PAGE)


def _dead(word: int) -> bool:
    """Whether a lock word says its holder is gone (OWNER_DIED, or no owner at all)."""
    return bool(word & _FUTEX_OWNER_DIED) or not word & _FUTEX_TID_MASK


class DeathWatch:
    """Calls ``dying(key)`` (from a thread of its own) when a watched worker's lock is released:
    it is exiting. A bounded number of threads; ``watch`` says False when they are all full."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[int, _Watch] = {}  # by the word's address
        self._threads: list[_Waiter] = []
        self._stopped = False

    def watch(self, fd: int, key: object, dying: Callable[[object], None]) -> bool:
        """Watch the lock in page `fd` (the caller keeps and closes `fd`), held by the worker
        `key`; call after the worker said it holds it. False: not watched (use the EOF)."""
        if not available():
            return False
        with self._lock:
            if self._stopped:
                return False
            waiter = next((t for t in self._threads if len(t.watches) < _PER_THREAD), None)
            if waiter is None:
                if len(self._threads) >= MAX_THREADS:
                    return False
                waiter = _Waiter(self)
                self._threads.append(waiter)
                waiter.start()
            w = _Watch(fd, key, dying)
            waiter.add(w)
        return True

    def threads(self) -> int:
        """How many watcher threads run now."""
        return sum(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        """End every watcher thread and unmap every page (the app stopped)."""
        with self._lock:
            self._stopped = True
            threads, self._threads = self._threads, []
        for t in threads:
            t.stop()
        for t in threads:
            t.join()


class _Waiter(threading.Thread):
    """Waits on up to _PER_THREAD words and on its own control word (bumped to look again)."""

    def __init__(self, owner: DeathWatch) -> None:
        super().__init__(name="otpmesh-deathwatch", daemon=True)
        self._owner = owner
        self.watches: list[_Watch] = []
        self._control = ctypes.c_uint32(0)
        self._stopping = False

    def add(self, w: _Watch) -> None:  # under the owner's lock
        self.watches.append(w)
        self._poke()

    def stop(self) -> None:
        self._stopping = True
        self._poke()

    def _poke(self) -> None:
        self._control.value += 1
        _libc.syscall(
            _SYS_FUTEX, ctypes.byref(self._control), _FUTEX_WAKE | _FUTEX_PRIVATE, 1, None, None, 0
        )

    def run(self) -> None:
        try:
            while not self._stopping:
                with self._owner._lock:
                    watches = list(self.watches)
                    control = self._control.value
                gone = [w for w in watches if _dead(w.word())]
                if gone:
                    with self._owner._lock:
                        for w in gone:
                            self.watches.remove(w)
                    for w in gone:
                        w.unmap()
                        w.dying(w.key)
                    continue
                vec = (_Waitv * (len(watches) + 1))()
                vec[0] = _Waitv(
                    control, ctypes.addressof(self._control), _FUTEX2_SIZE_U32 | _FUTEX_PRIVATE, 0
                )
                for i, w in enumerate(watches, 1):
                    vec[i] = _Waitv(w.word(), w.addr, _FUTEX2_SIZE_U32, 0)
                # Woken, a word changed before the wait (EAGAIN), a signal, or the deadline (a
                # backstop: stop() wakes the control word): look again.
                deadline = time.clock_gettime(time.CLOCK_MONOTONIC) + _BACKSTOP
                until = _Timespec(int(deadline), int(deadline % 1 * 1e9))
                _libc.syscall(
                    _SYS_FUTEX_WAITV,
                    vec,
                    len(watches) + 1,
                    0,
                    ctypes.byref(until),
                    _CLOCK_MONOTONIC,
                )
        finally:
            with self._owner._lock:
                left, self.watches = self.watches, []
            for w in left:
                w.unmap()
