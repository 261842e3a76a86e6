"""The takeover journal's files on disk: the room each holds, and a snapshot written whole.

Each journal file holds the room it will grow into (``room``: to its compaction point and a
quarter past it) as blocks of its own, taken when it is made: Linux's ``fallocate`` with
``FALLOC_FL_KEEP_SIZE``, so the size a reader sees does not change and the appends that follow
fill blocks the file has already. Another user who fills the file system takes none of them.
Not ``os.posix_fallocate`` on the journal (it grows the file: a reader would find zeros), nor on
a spare file given back when the disk is full (the filler would take the freed blocks first).
A file system without ``fallocate`` (some network ones) gets no room: its journal is written
while the file system has space, and says so once when it has not (_journal.py).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._journalstate import encode
from ._statedir import open_private

_KEEP_SIZE = 1  # FALLOC_FL_KEEP_SIZE, linux/falloc.h
_NO_FALLOCATE = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


#: The most room a journal file holds past its size: one compacted only past a bigger bound
#: (or never: a benchmark's) does not try to take the whole disk.
ROOM_MAX = 64 << 20


def room(size: int, compact_bytes: int) -> int:
    """The bytes a journal file of `size` bytes reserves: up to where it is compacted (that
    many bytes past it, or `compact_bytes` if more) and a quarter of that past it, for the
    records appended while its snapshot is written; ROOM_MAX past it at most."""
    return size + min(max(compact_bytes, size) * 5 // 4, ROOM_MAX)


def reserve(fd: int, size: int) -> bool:
    """Give the file at `fd` its first `size` bytes as blocks of its own, its size unchanged
    (``fallocate`` with ``FALLOC_FL_KEEP_SIZE``): appends up to there need nothing from the
    file system. False where the file system cannot; OSError where it has no room."""
    if _FALLOCATE is None:
        return False
    if _FALLOCATE(fd, _KEEP_SIZE, 0, size) == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_FALLOCATE:
        return False
    raise OSError(code, f"cannot reserve {size} bytes for the journal: {os.strerror(code)}")


def _libc_fallocate() -> Callable[[int, int, int, int], int] | None:
    """Linux's fallocate(2), from the C library; None where it has none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    function.restype = ctypes.c_int
    return function


_FALLOCATE = _libc_fallocate()


def write_snapshot(tmp: Path, records: list[dict[str, Any]], compact_bytes: int) -> tuple[int, int]:
    """Write `records` to a fresh file `tmp` (0600, no link; one left there is removed) holding
    its ``room``, fsync'd: its fd and size."""
    data = b"".join(encode(record) for record in records)
    tmp.unlink(missing_ok=True)
    fd = open_private(tmp, os.O_RDWR | os.O_APPEND | os.O_EXCL)
    try:
        reserve(fd, room(len(data), compact_bytes))
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd, len(data)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
