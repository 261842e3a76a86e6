"""The takeover journal's file: appended to by the active controller, read by the controller
that takes its run over, compacted to what is still true once it has grown (the records and
what they fold to: _journalstate.py).

Only the ``app`` and ``stopped`` records and chaos's marks are fsync'd: a controller that dies
leaves what it wrote in the kernel's page cache for the standby, and a host that loses power
loses its workers too. The bytes after the last newline are a write the controller's death cut
short: a reader drops them.

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

Room: each journal file holds the room it will grow into as blocks of its own, taken when it
is made (_journalfile.py); a file that cannot have it is not used. Another user who fills the
file system then takes nothing the journal needs until it has grown that far: only the next
compaction needs room, for its new file.

A journal that cannot be written (a full disk past that room, an I/O error, a short write) never
ends the controller: the app goes on, the journal is cut to a ``gap`` record that says why (a
standby that takes over meanwhile starts the tree afresh, never from a journal that misses
records), one warning says that takeover is unavailable and why, and the controller tries again
(``RETRY_FIRST``, doubling up to ``RETRY_MAX`` seconds apart): once there is room it writes the
whole journal again as a snapshot of what it holds in memory (a compaction), and says so. So
either the journal is whole or the app has said that takeover is unavailable; never a partial
line in the middle of the file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from .._core._errors import TakeoverError
from ._journalfile import reserve, room, write_all, write_snapshot
from ._journalstate import encode, fold, parse
from ._statedir import JOURNAL, epoch_lock, fsync_dir, open_private, read_epoch

log = logging.getLogger("otpmesh.takeover")

#: Compact once the journal is this many bytes past its last snapshot (or the snapshot's own
#: size, if larger, so that a big tree is not rewritten on every append). A MiB is about 7,000
#: restarts, which a standby reads and folds in about 0.1 s; a compaction stops the event loop
#: for a few milliseconds (``python -m otpmesh.bench takeover --journal N`` measures both).
COMPACT_BYTES = 1 << 20
#: How long after a failed write the journal is first tried again (seconds); each next try
#: waits twice as long, up to RETRY_MAX.
RETRY_FIRST, RETRY_MAX = 0.25, 2.0
_TMP = f"{JOURNAL}.new"
_NEVER = 1 << 62
#: What a journal cut to its ``gap`` record keeps for it and the ``stopped`` that may follow.
_GAP_ROOM = 4096


def read_journal(root: Path) -> list[dict[str, Any]]:
    """The journal's records, oldest first (a torn line and what follows it dropped; ``parse``)."""
    path = root / JOURNAL
    if not path.exists():
        return []
    fd = open_private(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    records = parse(data)
    if data.count(b"\n") > len(records):
        log.warning(
            "takeover: line %d of the journal in %s is a write cut short (a full disk?) with "
            "the next record glued to it: the journal is read up to the line before it",
            len(records) + 1,
            root,
        )
    return records


class Journal:
    """The journal of one app run, appended to by its active controller (see the module
    docstring). `after` is the journal it continues, as read (a takeover), or None for a fresh
    one; `epoch` is this controller's. Compactions run in `nursery` (their file work in a
    worker thread), as do the tries to write the journal again after it could not be; without
    one, they run inline (the tries on the next append, RETRY_FIRST... seconds apart)."""

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
        self._fd, self._size, self._base = -1, 0, 0  # _base: the size of the last snapshot
        self._aside: list[bytes] | None = None  # appended while a snapshot is being written
        self._aside_durable = False
        self._closed = False
        #: Why takeover is unavailable now (the journal could not be written), or None: the
        #: journal holds every record.
        self.unavailable: str | None = None
        self._retrying: trio.CancelScope | None = None  # the task trying again
        self._retry_delay, self._retry_at = RETRY_FIRST, 0.0
        #: Statistics: each compaction's duration and how long it held the event loop
        #: (seconds), how many records appended meanwhile it carried into the snapshot, and
        #: how many times the journal could not be written.
        self.compactions: list[float] = []
        self.pauses: list[float] = []
        self.carried = 0
        self.outages = 0
        try:
            if after is None:
                self._fd = open_private(root / JOURNAL, os.O_RDWR | os.O_APPEND | os.O_TRUNC)
                reserve(self._fd, room(0, compact_bytes))
            else:
                self._fd, self._size = _fence(root, epoch, self.state.records(), compact_bytes)
                self._base = self._size
        except OSError as exc:
            self._lost(exc)

    def append(self, record: dict[str, Any], *, durable: bool = False) -> None:
        """Journal `record`; never raises for a journal that cannot be written (see the module
        docstring): the app goes on."""
        if self._closed:
            return  # the run stopped in order: its stop is the last record
        self.state.add(record)
        line = encode(record)
        if self._aside is not None:  # a snapshot is being written: it carries this record too
            self._aside.append(line)
            self._aside_durable |= durable
        if self.unavailable is not None:
            self._append_unavailable(record, line)
            return
        try:
            written = os.write(self._fd, line)  # O_APPEND, one write: lines never interleave
            if written != len(line):
                raise OSError(f"a short write: {written} of {len(line)} bytes (a full disk?)")
            if durable:
                os.fsync(self._fd)
        except OSError as exc:
            self._lost(exc)
            return
        self._size += len(line)
        if self._aside is None and self._size - self._base > max(self._compact_bytes, self._base):
            self.compact()

    def _append_unavailable(self, record: dict[str, Any], line: bytes) -> None:
        """While the journal is cut to its gap: a stop is written after the gap (a standby then
        ends, as after any orderly stop), the rest waits for the journal's next try."""
        if "stopped" in record:
            with contextlib.suppress(OSError):
                os.write(self._fd, line)  # the gap's room holds it
                os.fsync(self._fd)
        if self._retrying is None and self._aside is None and time.monotonic() >= self._retry_at:
            if self._has_room():
                self.compact()

    def compact(self) -> None:
        """Rewrite the journal as its snapshot: now, or in the nursery if there is one."""
        started = time.perf_counter()
        records = self.state.records()  # the snapshot: this instant's, records appended
        if self._nursery is not None:  # from now on are kept aside
            self._aside, self._aside_durable = [], False
            if self._spawn(self._compact_aside, records, started):
                self.pauses.append(time.perf_counter() - started)
                return
            self._aside = None
        fd = -1
        try:
            fd, size = write_snapshot(self._root / _TMP, records, self._compact_bytes)
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
            fd, size = await trio.to_thread.run_sync(
                write_snapshot, self._root / _TMP, records, self._compact_bytes
            )
            resumed = time.perf_counter()
            aside, durable = b"".join(mine or []), self._aside_durable
            self._aside = None  # the next compaction may start once this one has swapped
            if self._closed:
                return  # closed meanwhile: the old journal holds everything (or its stop)
            write_all(fd, aside)
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
        next try comes when it has grown as much again. While the journal is unavailable, the
        next try comes later (its warning said so already)."""
        if self.unavailable is not None:
            self._retry_at = time.monotonic() + self._retry_delay
            self._retry_delay = min(2 * self._retry_delay, RETRY_MAX)
            return
        log.warning("takeover: the journal could not be compacted: %s", exc)
        self._base = self._size

    def _lost(self, exc: OSError) -> None:
        """The journal could not be written: cut it to a gap, say so once, and try again."""
        if self.unavailable is not None:
            return
        why = str(exc) or type(exc).__name__
        self.unavailable, self.outages = why, self.outages + 1
        unmarked = self._cut_to_gap(why)
        log.warning(
            "takeover: the journal in %s could not be written (%s): takeover is unavailable "
            "until it can be (a standby would start the tree afresh)%s; the app goes on, and "
            "the journal is written whole again once there is room",
            self._root,
            why,
            "" if unmarked is None else f", and the journal could not say so ({unmarked})",
        )
        self._retry_delay, self._retry_at = RETRY_FIRST, time.monotonic() + RETRY_FIRST
        scope = trio.CancelScope()
        if self._retrying is None and self._spawn(self._try_again, scope):
            self._retrying = scope  # (one still running from the last outage tries on)

    def _cut_to_gap(self, why: str) -> str | None:
        """Cut the journal to a ``gap`` record saying `why` (truncating frees its room, a part
        of which it keeps); None, or why that could not be done either."""
        gap = encode({"gap": os.getpid(), "why": why[:200]})
        try:
            if self._fd >= 0:
                os.ftruncate(self._fd, 0)
            else:  # it could not even be made: the file there is an older run's
                with epoch_lock(self._root):
                    if read_epoch(self._root) > self._epoch:
                        return "a newer controller took the directory over"
                    (self._root / JOURNAL).unlink(missing_ok=True)
                    self._fd = open_private(self._root / JOURNAL, os.O_RDWR | os.O_APPEND)
            self._size = 0
            with contextlib.suppress(OSError):
                reserve(self._fd, _GAP_ROOM)
            write_all(self._fd, gap)
            os.fsync(self._fd)
        except (OSError, TakeoverError) as exc:
            return str(exc)
        self._size = len(gap)
        return None

    async def _try_again(self, scope: trio.CancelScope) -> None:
        """Until the journal is whole again: wait, then write it whole (a compaction) if the
        file system seems to have room for it."""
        delay = RETRY_FIRST
        with scope:
            while self.unavailable is not None:
                await trio.sleep(delay)
                delay = min(2 * delay, RETRY_MAX)
                if self._aside is None and self._has_room():
                    started = time.perf_counter()
                    records, self._aside, self._aside_durable = self.state.records(), [], False
                    self.pauses.append(time.perf_counter() - started)
                    await self._compact_aside(records, started)
        if self._retrying is scope:
            self._retrying = None

    def _has_room(self) -> bool:
        """Whether the file system seems to have room for the journal's last snapshot and the
        room it holds (a try when it has not would take the snapshot on the event loop for
        nothing)."""
        try:
            fs = os.statvfs(self._root)
        except OSError:
            return True
        free = fs.f_bfree if os.geteuid() == 0 else fs.f_bavail
        return free * fs.f_frsize >= room(self._base, self._compact_bytes)

    def _spawn(self, task: Callable[..., Awaitable[None]], *args: Any) -> bool:
        """Start `task` in the nursery; False without one, or once it is closing."""
        if self._nursery is None:
            return False
        try:
            self._nursery.start_soon(task, *args)
        except RuntimeError:  # closed to new tasks: the app is ending
            return False
        return True

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
                self._compact_bytes = self._base = self._retry_at = _NEVER
                if self._retrying is not None:
                    self._retrying.cancel()
                return False
            os.replace(self._root / _TMP, self._root / JOURNAL)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._size, self._base = fd, size, size
        self.compactions.append(time.perf_counter() - started)
        if self.unavailable is not None:
            log.warning(
                "takeover: the journal in %s is whole again: takeover is available", self._root
            )
            self.unavailable = None
        return True

    def close(self) -> None:
        self._closed = True
        if self._retrying is not None:
            self._retrying.cancel()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _fence(
    root: Path, epoch: int, records: list[dict[str, Any]], compact_bytes: int
) -> tuple[int, int]:
    """A takeover's journal: the run it continues, as its snapshot `records`, renamed over the
    journal (its fd and size). The controller it takes over from may still be running (cut off
    from most of its hosts, it acts until its quorum timeout): what it appends from now on goes
    to the file it has open, no longer the journal, and never into this run's records."""
    name = f"{JOURNAL}.{epoch}.new"  # never the name a compaction of that controller uses
    fd, size = write_snapshot(root / name, records, compact_bytes)
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
