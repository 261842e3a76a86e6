"""The takeover journal's file: appended to by the active controller, read by the controller
that takes its run over, compacted to what is still true once it has grown (the records and
what they fold to: _journalstate.py).

Only the ``app`` and ``stopped`` records and chaos's marks are fsync'd: a controller that dies
leaves what it wrote in the kernel's page cache for the standby, and a host that loses power
loses its workers too. The bytes after the last newline are a write cut short (the controller
died in it, or the disk filled): a reader drops them.

A takeover starts the journal over: the controller that takes the run over writes the run it
read as a snapshot (so a torn line is gone too) and renames it over the journal before its
first record. The controller it replaced may still be running (across hosts, one cut off from
most of its hosts acts until its quorum timeout); what that one appends goes to the file it
holds open, no longer the journal, so no record of a replaced controller lands among its
successor's.

Compaction: once the journal has grown ``COMPACT_BYTES`` (or its last snapshot's size, if
larger) past its last snapshot, the controller takes the snapshot of what its records still say
(``JournalState.records``), and a worker thread writes it to ``journal.new`` and fsyncs it,
while the event loop goes on appending to ``journal`` (and keeps those records aside). Back on
the loop, with no checkpoint in between, it appends the records kept aside to ``journal.new``,
renames it over ``journal`` and appends there from then on; then the directory is fsync'd. So
no record is lost, and a reader (one that holds the lease, or a standby on hosts that only
reads) opens either the old file or the new one, each whole. It never renames over a journal
a controller with a higher epoch took over: that one is no longer this controller's (the check
and the rename hold ``epoch_lock``, which a standby's epoch bump takes too, so a standby that
took over across hosts from a controller still running opens the journal after the rename or
makes the check fail).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import trio

from .._core._errors import TakeoverError
from ._journalstate import encode, fold, parse
from ._statedir import JOURNAL, epoch_lock, fsync_dir, open_private, read_epoch

log = logging.getLogger("otpmesh.takeover")

#: Compact once the journal is this many bytes past its last snapshot (or the snapshot's own
#: size, if larger, so that a big tree is not rewritten on every append). A MiB is about 7,000
#: restarts, which a standby reads and folds in about 0.1 s; a compaction stops the event loop
#: for a few milliseconds (``python -m otpmesh.bench_takeover --journal N`` measures both).
COMPACT_BYTES = 1 << 20
_TMP = f"{JOURNAL}.new"
_NEVER = 1 << 62


def read_journal(root: Path) -> list[dict[str, Any]]:
    """The journal's records, oldest first (a torn last line dropped; ``parse``)."""
    path = root / JOURNAL
    if not path.exists():
        return []
    fd = open_private(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return parse(f.read())


class Journal:
    """The journal of one app run, appended to by its active controller (see the module
    docstring). `after` is the journal it continues, as read (a takeover), or None for a fresh
    one; `epoch` is this controller's. Compactions run in `nursery` (their file work in a
    worker thread), or inline without one."""

    def __init__(
        self,
        root: Path,
        *,
        epoch: int,
        after: list[dict[str, Any]] | None = None,
        compact_bytes: int = COMPACT_BYTES,
        nursery: trio.Nursery | None = None,
    ) -> None:
        self._root, self._epoch, self._compact_bytes = root, epoch, compact_bytes
        self._nursery = nursery
        self.state = fold(after or [])
        if after is None:
            self._fd = open_private(root / JOURNAL, os.O_RDWR | os.O_APPEND | os.O_TRUNC)
            self._size = self._base = 0  # the size of the last snapshot
        else:
            self._fd, self._size = _fence(root, epoch, self.state.records())
            self._base = self._size
        self._aside: list[bytes] | None = None  # appended while a snapshot is being written
        self._aside_durable = False
        #: Statistics: each compaction's duration and how long it held the event loop
        #: (seconds), and how many records appended meanwhile it carried into the snapshot.
        self.compactions: list[float] = []
        self.pauses: list[float] = []
        self.carried = 0

    def append(self, record: dict[str, Any], *, durable: bool = False) -> None:
        self.state.add(record)
        line = encode(record)
        os.write(self._fd, line)  # O_APPEND, one write: lines never interleave
        if durable:
            os.fsync(self._fd)
        self._size += len(line)
        if self._aside is not None:
            self._aside.append(line)
            self._aside_durable |= durable
        elif self._size - self._base > max(self._compact_bytes, self._base):
            self.compact()

    def compact(self) -> None:
        """Rewrite the journal as its snapshot: now, or in the nursery if there is one."""
        started = time.perf_counter()
        records = self.state.records()  # the snapshot: this instant's, records appended
        if self._nursery is not None:  # from now on are kept aside
            self._aside, self._aside_durable = [], False
            self._nursery.start_soon(self._compact_aside, records, started)
            self.pauses.append(time.perf_counter() - started)
            return
        fd = -1
        try:
            fd, size = _write_snapshot(self._root, records)
            if self._swap(fd, size, started):
                fd = -1
                fsync_dir(self._root)
        except (OSError, TakeoverError) as exc:
            self._failed(exc)
        finally:
            self._discard(fd)
        self.pauses.append(time.perf_counter() - started)

    async def _compact_aside(self, records: list[dict[str, Any]], started: float) -> None:
        fd, mine = -1, self._aside
        try:
            fd, size = await trio.to_thread.run_sync(_write_snapshot, self._root, records)
            resumed = time.perf_counter()
            aside, durable = b"".join(mine or []), self._aside_durable
            self._aside = None  # the next compaction may start once this one has swapped
            if self._fd < 0:
                return  # closed meanwhile: the old journal holds everything
            _write_all(fd, aside)
            if aside and durable:
                os.fsync(fd)
            self.carried += aside.count(b"\n")
            if self._swap(fd, size + len(aside), started):
                fd = -1
            self.pauses[-1] += time.perf_counter() - resumed
            if fd < 0:
                await trio.to_thread.run_sync(fsync_dir, self._root)
        except (OSError, TakeoverError) as exc:
            self._failed(exc)
        finally:
            if self._aside is mine:  # not the next compaction's
                self._aside = None
            self._discard(fd)

    def _failed(self, exc: Exception) -> None:
        """A compaction that could not write (a full disk): the journal grows on, and the
        next try comes when it has grown as much again."""
        log.warning("takeover: the journal could not be compacted: %s", exc)
        self._base = self._size

    def _discard(self, fd: int) -> None:
        if fd >= 0:
            os.close(fd)
            (self._root / _TMP).unlink(missing_ok=True)

    def _swap(self, fd: int, size: int, started: float) -> bool:
        """Rename the snapshot at `fd` over the journal and append there from now on; False
        (nothing renamed) when a controller with a higher epoch took the directory over."""
        with epoch_lock(self._root):  # a standby bumps it before it opens the journal
            newer = read_epoch(self._root)
            if newer > self._epoch:
                log.warning("takeover: epoch %d took the journal over; not compacting it", newer)
                self._compact_bytes = self._base = _NEVER
                return False
            os.replace(self._root / _TMP, self._root / JOURNAL)
        os.close(self._fd)
        self._fd, self._size, self._base = fd, size, size
        self.compactions.append(time.perf_counter() - started)
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _fence(root: Path, epoch: int, records: list[dict[str, Any]]) -> tuple[int, int]:
    """A takeover's journal: the run it continues, as its snapshot `records`, renamed over the
    journal (its fd and size). The controller it takes over from may still be running (cut off
    from most of its hosts, it acts until its quorum timeout): what it appends from now on goes
    to the file it has open, no longer the journal, and never into this run's records."""
    name = f"{JOURNAL}.{epoch}.new"  # never the name a compaction of that controller uses
    fd, size = _write_snapshot(root, records, name)
    try:
        with epoch_lock(root):
            newer = read_epoch(root)
            if newer > epoch:
                raise TakeoverError(
                    f"takeover: epoch {newer} took the state directory over while this "
                    f"controller (epoch {epoch}) was starting"
                )
            os.replace(root / name, root / JOURNAL)
        fsync_dir(root)
    except BaseException:
        os.close(fd)
        (root / name).unlink(missing_ok=True)
        raise
    return fd, size


def _write_snapshot(root: Path, records: list[dict[str, Any]], name: str = _TMP) -> tuple[int, int]:
    """Write `records` to a fresh file `name` (0600, no link), fsync'd: its fd and size."""
    data = b"".join(encode(record) for record in records)
    tmp = root / name
    tmp.unlink(missing_ok=True)
    fd = open_private(tmp, os.O_RDWR | os.O_APPEND | os.O_EXCL)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, len(data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
