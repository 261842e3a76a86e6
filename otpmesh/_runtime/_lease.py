"""The active controller's lease in a takeover's state directory, and the kernel's word on who
holds it.

The lease is an exclusive ``flock`` on ``<dir>/lease``: the kernel releases it when its holder
dies (SIGKILL included), which is what wakes a standby. A standby waits for it in the kernel's
queue (``acquire``: a blocking ``flock`` in a thread), so a same-user process that blocks on it
too competes on equal terms instead of winning every time against a poll. Who holds it is read
from ``/proc/locks`` (``holders``): the fork server attaches only a controller whose pid the
kernel names there (_forkstandby.py), and a standby that finds the lease held by a process that
is neither the active controller nor itself names that process, loudly (_controller/_takeover).

Plain functions and blocking calls: the fork server (no trio) uses ``holds``.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .._core._errors import TakeoverError
from ._statedir import LEASE, open_private

PROC_LOCKS = "/proc/locks"


def holders(path: str | os.PathLike[str]) -> list[int]:
    """The pids the kernel says hold a lock on the file at `path` now (waiters left out); []
    if the file is gone or /proc/locks cannot be read."""
    try:
        st = os.stat(path)
        with open(PROC_LOCKS) as f:
            text = f.read()
    except OSError:
        return []
    # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF": major and minor in hex, the inode in
    # decimal; a waiter's line has "->" after the number.
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == inode:
            try:
                pids.append(int(fields[4]))
            except ValueError:
                continue
    return pids


def holds(path: str | os.PathLike[str], pid: int) -> bool:
    """Whether the kernel says process `pid` holds the lease at `path` (pid 0: a process of
    another pid namespace, which cannot be told apart: no)."""
    return pid > 0 and pid in holders(path)


def describe(pid: int) -> str:
    """``pid 1234 (python job.py --standby)``: a process as the user can find it."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"pid {pid}"
    cmd = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return f"pid {pid} ({cmd[:120]})" if cmd else f"pid {pid}"


class Lease:
    """The lease file, opened (0600, this user's; ``open_private``), held or not."""

    def __init__(self, root: Path) -> None:
        self.path = root / LEASE
        self._fd = open_private(self.path, os.O_RDWR)

    def try_acquire(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def acquire(self) -> None:
        """Wait for the lease in the kernel's queue (blocking: run it in a thread). A thread
        abandoned in it is harmless: once ``release`` closed the descriptor, the lock it gets
        goes with the file's last reference."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def check_held(self) -> None:
        """After acquiring: the file at the path is the one this lease locked (not replaced
        under it), and the kernel names this process as its holder."""
        try:
            same = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except OSError:
            same = False
        if not same or not holds(self.path, os.getpid()):
            raise TakeoverError(
                f"takeover: the lease {str(self.path)!r} was replaced or is not held by this "
                f"process (the kernel names {holders(self.path) or 'nobody'}); another process "
                "is tampering with the state directory: refusing to take over"
            )

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the last descriptor releases the lock
            self._fd = -1
