"""Warm memory files for values sent in messages, refilled once no reader maps them.

A large value sent in a message is copied into a memory file (``Snapshot``) that readers of the
same host map copy-on-write. The kernel allocates a new file's pages far slower than it copies
into existing ones (measured here, 256 MiB: 1.4 GB/s new, 11 GB/s warm), so a file whose buffer
is gone and that no reader maps any more waits in this pool, and the next value it fits is
copied into its warm pages: a learner that sends its weights every step copies them at memory
speed from the second step on.

Refilling is safe only once no reader maps the file (a private mapping sees the file's pages
until it writes to them), so the owner counts leases, per reader connection:

- each pin of a snapshot's buffer takes a lease; a reader that copied instead of mapping says so
  when it unpins (``mapped: False``), which ends it;
- a reader that mapped it ends the lease with an ``unmapped`` request, sent once its mapping is
  gone (when the last tensor over it is freed);
- a connection that closes with leases open (its reader died, or it may still map the file)
  orphans the file: it is never refilled, and closed once its buffer is gone (its memory goes
  with the last mapping).

A free file takes a value of at most its size and more than half of it; it is closed after
``IDLE`` s unused, or at once where the free files would pass the pool's limit
(``OTPMESH_CHANNEL_POOL`` bytes, a quarter of the machine's memory by default; 0: no reuse).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable

import trio

from ._backend import Region
from ._error import RDMAError
from ._snapshot import Snapshot

#: Seconds a free file waits for a value before it is closed.
IDLE = 60.0
log = logging.getLogger("otpmesh.rdma")
#: The lease key of this process's own mappings (a message between two actors of one process).
LOCAL = 0


def from_any_thread(end_lease: Callable[[bool], None]) -> Callable[[bool], None]:
    """`end_lease` made callable from any thread, at any time (a mapping is freed wherever the
    garbage collector frees it): it runs soon in this trio run, or not at all once the run is
    over (the connections it would use are gone with it)."""
    token = trio.lowlevel.current_trio_token()

    def run(forked: bool) -> None:  # in the run's thread: an exception would end the whole run
        try:
            end_lease(forked)
        except Exception:
            log.exception("tensor channel: a mapping's lease could not be ended")

    def call(forked: bool) -> None:
        try:
            token.run_sync_soon(run, forked)
        except trio.RunFinishedError:
            pass

    return call


def pool_limit() -> int:
    """The bytes of free memory a process's pool keeps (``OTPMESH_CHANNEL_POOL``; by default a
    quarter of the machine's memory, or of its cgroup's limit where that is smaller)."""
    configured = os.environ.get("OTPMESH_CHANNEL_POOL")
    if configured is None:
        return memory_limit() // 4
    try:
        limit = int(configured)
    except ValueError:
        limit = -1
    if limit < 0:
        raise RDMAError(
            f"OTPMESH_CHANNEL_POOL must be a number of bytes (0 or more), not {configured!r}"
        )
    return limit


def memory_limit(cgroup: str = "/sys/fs/cgroup/memory.max") -> int:
    """The bytes of memory this process may use: the machine's, or its (v2) cgroup's limit
    where that is smaller (a container's)."""
    try:
        limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        limit = 4 << 30
    try:
        with open(cgroup) as f:
            text = f.read().strip()
    except OSError:
        return limit
    return min(limit, int(text)) if text.isdigit() else limit


class SnapshotPool:
    """One process's snapshot files: ``take`` one for a value, ``settle`` it whenever its buffer
    or its leases change; free ones wait for the next value they fit."""

    def __init__(self, limit: int | None = None, idle: float = IDLE) -> None:
        self.limit = pool_limit() if limit is None else limit
        self.idle = idle
        self._free: list[Snapshot] = []  # oldest first
        self.reused = 0  # how many values went into a warm file (statistics)

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def free_bytes(self) -> int:
        return sum(snap.capacity for snap in self._free)

    def take(self, src: Region) -> Snapshot:
        """A file holding a copy of `src`: the smallest free one it fits, else a new one."""
        fits = [s for s in self._free if src.nbytes <= s.capacity < 2 * src.nbytes]
        if not fits:
            snap = Snapshot.of(src)
        else:
            snap = min(fits, key=lambda s: s.capacity)
            self._free.remove(snap)
            try:
                snap.fill(src)
            except BaseException:
                snap.close()
                raise
            self.reused += 1
        snap.registered = True
        return snap

    def settle(self, snap: Snapshot, now: float) -> None:
        """Close `snap`, or keep it free for the next value, once no buffer holds it and no
        reader may map it; else nothing yet."""
        if snap.registered or snap.leases or snap.fd < 0:
            return
        if snap.orphaned or snap.capacity > self.limit:
            snap.close()
            return
        snap.free_since = now
        self._free.append(snap)
        while self.free_bytes > self.limit:  # the oldest go first
            self._free.pop(0).close()

    def next_trim(self) -> float:
        """When the oldest free file is due to close (trio's clock), or inf."""
        return self._free[0].free_since + self.idle if self._free else math.inf

    def trim(self, now: float = math.inf) -> None:
        """Close the free files unused for ``idle`` s by `now` (default: all of them)."""
        keep = []
        for snap in self._free:
            if snap.free_since + self.idle <= now:
                snap.close()
            else:
                keep.append(snap)
        self._free = keep
