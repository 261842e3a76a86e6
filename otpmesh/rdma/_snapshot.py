"""Snapshots: how a large value of a message reaches every process of its host with one copy.

The sender's channel copies the value once, when it sends the message, into an anonymous memory
file (``memfd_create``) sealed against shrinking and growing (``Snapshot``). A reader on the same
host receives a descriptor of the file from the owner itself, passed over the reader's own
connection (``SCM_RIGHTS``) with the answer to its pin (which names the file by its inode); it
checks the seals and the size, maps it copy-on-write (``MAP_PRIVATE``) and closes the descriptor
at once (``map_private``). Nothing reaches into the owner's process (no ``pidfd_getfd``, which a
non-dumpable controller refuses: ``_core/_dumpable.py``). So:

- a reader copies nothing: its tensor is the sender's snapshot, and a broadcast to n readers
  costs one copy in all; pages fault in as the reader first touches them;
- the reader's tensor is its own: writing to it copies the written pages (copy-on-write), and
  the sender never writes to a file while a reader maps it: a file is refilled only once every
  reader's mapping is gone (the leases of ``_pool.py``), so later writes on either side are
  invisible to the other;
- the owner fills the file through a mapping of its own and offers the backends another,
  read-only one: a ``process_vm_writev`` at the address a grant names fails (its pages are not
  writable there);
- nothing can leak: no file is named anywhere (not in /dev/shm), the reader keeps no descriptor,
  and the memory lives exactly as long as the last mapping or descriptor of it (the reader's
  tensor; the owner's registered buffer or pool); a SIGKILLed process's go with it;
- a reader can never be made to fault: it maps only a file sealed against shrinking
  (``F_SEAL_SHRINK``), of at least the size the grant says.

A file's first fill is a ``pwrite`` (the kernel allocates its pages as it copies, the fastest
way into new memory measured here); a refill copies into its warm pages, in a thread per core.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._backend import Region

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value
#: What a reader checks before it maps: the file cannot shrink under the mapping (no SIGBUS).
#: The owner also seals growth and the seals themselves.
SEALS = fcntl.F_SEAL_SHRINK
_OWN_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
_NAME = "otpmesh-channel"  # shows in /proc/PID/maps and fd links: "/memfd:otpmesh-channel"
_PAGE = mmap.PAGESIZE
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0x8000)  # Python 3.10+ on Linux has it
_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
_PIECE = 4 << 20  # a refill splits across threads from twice this size
_copiers: ThreadPoolExecutor | None = None
_copiers_made = threading.Lock()  # nodes of one process may run in threads of their own


def available() -> bool:
    """Whether this process can make and map snapshots (Linux, with memfd)."""
    return hasattr(os, "memfd_create")


def _map(fd: int, nbytes: int, flags: int, prot: int = mmap.PROT_READ | mmap.PROT_WRITE) -> int:
    address = _libc.mmap(None, nbytes, prot, flags, fd, 0)
    if address is None or address == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of a tensor snapshot failed: {os.strerror(err)}")
    return int(address)


# A live mapping's address -> [what to call once it is unmapped, whether a fork happened while
# it was mapped]. A forked child inherits the mapping and may keep its pages after this process
# freed them: the owner must then never refill the file (``end_when_freed``).
_ENDS: dict[int, list[Any]] = {}


def end_when_freed(memory: Any, on_free: Callable[[bool], None]) -> None:
    """Call ``on_free(forked)`` from whatever thread frees `memory` (a ``map_private`` mapping),
    after it is unmapped; `forked` says a child process was forked while it was mapped (the
    child may still see the file's pages). A forked child itself never calls it."""
    _ENDS[ctypes.addressof(memory)] = [on_free, False]


def _forked_parent() -> None:
    for end in list(_ENDS.values()):
        end[1] = True


@functools.lru_cache(maxsize=64)
def _mapping_type(nbytes: int) -> type[ctypes.Array[ctypes.c_char]]:
    base = ctypes.c_char * nbytes

    class Mapping(base):  # type: ignore[valid-type,misc]
        """Memory mapped by ``map_private``: unmapped when the last tensor over it is freed,
        then what ``end_when_freed`` set (if anything) is called."""

        def __del__(self, _munmap: Any = _libc.munmap, _ends: Any = _ENDS) -> None:
            address = ctypes.addressof(self)  # (bound now: safe at interpreter exit)
            end = _ends.pop(address, None)
            _munmap(address, nbytes)
            if end is not None:
                end[0](end[1])

    return Mapping


def _in_forked_child() -> None:
    global _copiers, _copiers_made
    _copiers = None  # a forked child has none of its parent's threads: make new ones
    _copiers_made = threading.Lock()  # (and a lock some parent thread held is held for good)
    _ENDS.clear()  # the leases are the parent's to end, over the parent's connections


os.register_at_fork(after_in_parent=_forked_parent, after_in_child=_in_forked_child)


def _copy_in_threads(dst: int, src: int, nbytes: int) -> None:
    """memmove `nbytes` from `src` to `dst`, a slice per core (ctypes lets go of the GIL)."""
    global _copiers
    parts = max(1, min(_THREADS, nbytes // _PIECE // 2))
    if parts == 1:
        ctypes.memmove(dst, src, nbytes)
        return
    with _copiers_made:
        if _copiers is None:
            _copiers = ThreadPoolExecutor(_THREADS, thread_name_prefix="otpmesh-snapshot")
        copiers = _copiers
    step = -(-nbytes // parts)
    spans = [(start, min(step, nbytes - start)) for start in range(0, nbytes, step)]
    for done in [copiers.submit(ctypes.memmove, dst + at, src + at, n) for at, n in spans]:
        done.result()


class Snapshot:
    """A sealed memory file of `capacity` bytes for one value sent in a message at a time:
    ``fill`` copies a value in, then ``region`` (a read-only shared mapping of its bytes) is what
    the backends read and ``fd`` what readers of this host map. Reused by ``SnapshotPool`` once
    no reader maps it; ``close`` when done with it for good.

    ``leases`` (connection key -> count: the mappings readers may still hold), ``registered``
    (a buffer holds it), ``orphaned`` (a lease was lost with its connection: never refill it)
    and ``free_since`` are the pool's bookkeeping."""

    def __init__(self, capacity: int) -> None:
        fd = os.memfd_create(_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, capacity)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _OWN_SEALS)
            reader = _map(fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.capacity = capacity
        self.region = Region(reader, 0)
        self._warm = False  # its pages exist (after the first fill)
        self._writer = 0  # the owner's writable mapping, made after the first fill
        self.leases: dict[int, int] = {}
        self.registered = False
        self.orphaned = False
        self.free_since = 0.0

    @classmethod
    def of(cls, src: Region) -> Snapshot:
        """A new snapshot of `src`, filled."""
        snap = cls(max(_PAGE, -(-src.nbytes // _PAGE) * _PAGE))
        try:
            snap.fill(src)
        except BaseException:
            snap.close()
            raise
        return snap

    def fill(self, src: Region) -> None:
        """Copy `src` (at most ``capacity`` bytes) in; ``region`` is then its bytes."""
        if src.nbytes > self.capacity:
            raise ValueError(f"{src.nbytes} bytes do not fit a {self.capacity}-byte snapshot")
        if self._warm:
            _copy_in_threads(self._writer, src.address, src.nbytes)
        else:
            # pwrite, not a copy through a mapping: the kernel allocates the file's pages as it
            # copies (no page fault per page), the fastest way into new pages measured here.
            view = memoryview((ctypes.c_char * src.nbytes).from_address(src.address)).cast("B")
            done = 0
            while done < src.nbytes:
                done += os.pwrite(self.fd, view[done:], done)
            self._warm = True  # sized for its first value: every page now exists
            # The mapping refills go through, populated now: a page fault per page at the
            # first refill would cost more than the copy.
            self._writer = _map(self.fd, self.capacity, mmap.MAP_SHARED | _MAP_POPULATE)
        self.region = Region(self.region.address, src.nbytes)

    def close(self) -> None:
        if self.fd >= 0:
            if self._writer:
                _libc.munmap(self._writer, self.capacity)
            _libc.munmap(self.region.address, self.capacity)
            os.close(self.fd)
            self.fd = -1


def map_private(fd: int, nbytes: int) -> Any:
    """A private (copy-on-write) mapping of `nbytes` of the snapshot file `fd` (this process's
    descriptor: its own snapshot's, or one its owner passed). A buffer object that unmaps itself
    when the last user is freed (``torch.frombuffer`` keeps it alive; ``end_when_freed``); `fd`
    may be closed at once. OSError if the file is not a sealed snapshot of at least `nbytes`."""
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)  # EINVAL: not a memory file at all
    size = os.fstat(fd).st_size
    if seals & SEALS != SEALS or size < nbytes:
        raise OSError(
            errno.EINVAL,
            f"the owner's snapshot is not sealed or too small ({size} bytes, "
            f"{nbytes} expected); refusing to map it",
        )
    address = _map(fd, nbytes, mmap.MAP_PRIVATE)
    return _mapping_type(nbytes).from_address(address)
