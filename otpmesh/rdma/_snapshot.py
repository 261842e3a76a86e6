"""Snapshots: how a large tensor of a call reaches every process of its host with one copy.

The sender's channel copies the tensor once, when it sends the message, into an anonymous memory
file (``memfd_create``) sealed against shrinking and growing (``Snapshot``). A reader on the same
host, once the owner's grant (checked against ``SO_PEERCRED``) names the file's descriptor, takes
a duplicate of it with ``pidfd_getfd(2)`` (the same permission ``process_vm_readv`` needs), checks
the seals and the size, maps it copy-on-write (``MAP_PRIVATE``) and closes the duplicate at once
(``map_private``). So:

- a reader copies nothing: its tensor is the sender's snapshot, and a broadcast to n readers
  costs one copy in all; pages fault in as the reader first touches them;
- the reader's tensor is its own: writing to it copies the written pages (copy-on-write), and
  nobody can write to the snapshot: the file is sealed against writes (``F_SEAL_WRITE``) and the
  sender maps it read-only, so later writes on either side are invisible to the other (a
  ``process_vm_writev`` into the sender's mapping fails: its pages are not writable);
- nothing can leak: no file is named anywhere (not in /dev/shm), the reader holds no descriptor,
  and the memory lives exactly as long as the last mapping or descriptor of it (the reader's
  tensor; the sender's registered buffer); a SIGKILLed process's go with it;
- a reader can never be made to fault, nor see the bytes change: it maps only a file sealed
  against shrinking and writes (``F_SEAL_SHRINK``, ``F_SEAL_WRITE``), of at least the size the
  handle says.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import mmap
import os
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
_SYS_PIDFD_GETFD = 438  # the same number on every architecture Linux numbers uniformly
#: A reader maps only a file sealed so: its size and its bytes cannot change under the mapping.
SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_NAME = "otpmesh-channel"  # shows in /proc/PID/maps and fd links: "/memfd:otpmesh-channel"


def available() -> bool:
    """Whether this process can make and map snapshots (Linux 5.6+ with memfd and pidfds)."""
    return hasattr(os, "memfd_create") and hasattr(os, "pidfd_open")


def _map(fd: int, nbytes: int, flags: int, prot: int = mmap.PROT_READ | mmap.PROT_WRITE) -> int:
    address = _libc.mmap(None, nbytes, prot, flags, fd, 0)
    if address is None or address == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of a tensor snapshot failed: {os.strerror(err)}")
    return int(address)


@functools.lru_cache(maxsize=64)
def _mapping_type(nbytes: int) -> type[ctypes.Array[ctypes.c_char]]:
    base = ctypes.c_char * nbytes

    class Mapping(base):  # type: ignore[valid-type,misc]
        """Memory mapped by ``map_private``: unmapped when the last tensor over it is freed."""

        def __del__(self, _munmap: Any = _libc.munmap) -> None:  # bound now: safe at exit
            _munmap(ctypes.addressof(self), nbytes)

    return Mapping


class Snapshot:
    """The sender's copy of a tensor in a sealed memory file: ``fd`` for readers of this host,
    ``region`` (a read-only shared mapping) for the other backends. ``close`` when the buffer is
    dropped."""

    def __init__(self, src: Region) -> None:
        fd = os.memfd_create(_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, src.nbytes)
            # pwrite, not a copy through a mapping: the kernel allocates the file's pages as it
            # copies (no page fault per page), the fastest way in measured here.
            view = memoryview((ctypes.c_char * src.nbytes).from_address(src.address)).cast("B")
            done = 0
            while done < src.nbytes:
                done += os.pwrite(fd, view[done:], done)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            address = _map(fd, src.nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.region = Region(address, src.nbytes)

    def close(self) -> None:
        if self.fd >= 0:
            _libc.munmap(self.region.address, self.region.nbytes)
            os.close(self.fd)
            self.fd = -1


def _pidfd_getfd(pid: int, fd: int) -> int:
    pidfd = os.pidfd_open(pid)
    try:
        got = int(_libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0))
    finally:
        os.close(pidfd)
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot take the owner's snapshot (pidfd_getfd): {os.strerror(err)}")
    return got


def map_private(fd: int, nbytes: int, *, pid: int | None = None) -> Any:
    """A private (copy-on-write) mapping of `nbytes` of the snapshot file `fd`: of process `pid`
    (a descriptor number in its table), or of this process. A buffer object that unmaps itself
    when the last user is freed (``torch.frombuffer`` keeps it alive). OSError if the file is not
    a sealed snapshot of at least `nbytes`."""
    own = fd if pid is None else _pidfd_getfd(pid, fd)
    try:
        seals = fcntl.fcntl(own, fcntl.F_GET_SEALS)  # EINVAL: not a memory file at all
        size = os.fstat(own).st_size
        if seals & SEALS != SEALS or size < nbytes:
            raise OSError(
                errno.EINVAL,
                f"the owner's snapshot is not sealed or too small ({size} bytes, "
                f"{nbytes} expected); refusing to map it",
            )
        address = _map(own, nbytes, mmap.MAP_PRIVATE)
    finally:
        if own != fd:
            os.close(own)
    return _mapping_type(nbytes).from_address(address)
