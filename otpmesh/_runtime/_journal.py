"""The takeover journal: one JSON record a line, appended by the active controller and read by
the controller that takes its run over; compacted to what is still true once it has grown.

The records, by the key that names their kind:

- ``app``: a run's start (its secret, epoch); everything of the run follows it. fsync'd.
- ``proc`` / ``exited``: a worker process started (pid, address, rank, coords) / is gone.
- ``actor``: an actor started (its incarnation, the process it runs in).
- ``restart``: a supervisor restarted a child (``at``: wall-clock seconds; ``window``: how many
  of its restarts, this one included, are still inside its intensity period, all a later
  intensity check can count).
- ``group``: a process group's epoch. ``chaos``: a controller kill ``otpmesh.chaos`` threw.
- ``stopped``: the run stopped in order: nothing to take over. fsync'd.

Only the ``app`` and ``stopped`` records (and chaos marks) are fsync'd: a controller that dies
leaves what it wrote in the kernel's page cache for the standby, and a host that loses power
loses its workers too. A record whose kind the reader does not know is an error, never skipped:
a journal from another version of otpmesh must not be half understood.

Compaction (``Journal.compact``): once the journal has grown ``COMPACT_BYTES`` (or its last
snapshot's size, if larger) past its last snapshot, the controller writes the snapshot of what
the records still say (``JournalState.records``) to ``journal.new``, fsyncs it, renames it over
``journal`` and fsyncs the directory. It does so inside the append that crossed the bound, on
the one thread that appends, so no record can be appended meanwhile; a reader opens either the
old file or the new one, each whole. Every run's records fold to the same state before and after.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._core._errors import TakeoverError
from ._statedir import JOURNAL, fsync_dir, open_private, read_epoch

log = logging.getLogger("otpmesh.takeover")

#: Compact once the journal is this many bytes past its last snapshot (or the snapshot's own
#: size, if larger, so that a big tree is not rewritten on every append). A MiB is about 8,000
#: restarts; a standby reads and folds it in a few tens of milliseconds, and one compaction
#: stops the controller's event loop for about as long as writing its snapshot takes
#: (``python -m otpmesh.bench_takeover --journal`` measures both).
COMPACT_BYTES = 1 << 20
#: The record kinds, by the key that names each; the order matters where records share keys
#: (an ``actor`` record names its ``proc`` too).
KINDS = ("app", "stopped", "actor", "proc", "exited", "restart", "group", "chaos")
_TMP = f"{JOURNAL}.new"


def record_kind(record: object, line: int) -> str:
    """The kind of `record` (read from journal line `line`); TakeoverError if it has none."""
    if isinstance(record, dict):
        for kind in KINDS:
            if kind in record:
                return kind
    raise TakeoverError(
        f"takeover: line {line} of the journal is a record this version of otpmesh does not "
        f"understand: {str(record)[:200]}; was the state directory written by another version? "
        "Give this run a fresh directory"
    )


def encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":")) + "\n").encode()


@dataclass
class JournalState:
    """What the journal's records, folded oldest first, still say is true. Its ``records()``
    fold to an equal state: they are the journal's snapshot."""

    #: The last run's app record; None when there is none or it stopped in order.
    app: dict[str, Any] | None = None
    stopped: dict[str, Any] | None = None
    #: The last run's live worker processes, by proc id.
    procs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The last run's last start of each actor, by path.
    actors: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The last run's restart times (wall clock, oldest first) each supervisor may still count.
    restarts: dict[str, list[float]] = field(default_factory=dict)
    #: Every run's last epoch of each process group, by path, and chaos's marks.
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    marks: list[dict[str, Any]] = field(default_factory=list)

    def add(self, record: dict[str, Any], line: int = 0) -> None:
        kind = record_kind(record, line)
        if kind in ("app", "stopped"):
            self.app, self.stopped = (record, None) if kind == "app" else (None, record)
            self.procs, self.actors, self.restarts = {}, {}, {}
        elif kind == "actor":
            self.actors[str(record["actor"])] = record
        elif kind == "proc":
            self.procs[str(record["proc"])] = record
        elif kind == "exited":
            self.procs.pop(str(record["exited"]), None)
        elif kind == "restart":
            times = self.restarts.setdefault(str(record["restart"]), [])
            times.append(float(record["at"]))
            window = record.get("window")
            if isinstance(window, int) and not isinstance(window, bool) and window > 0:
                del times[:-window]  # the older ones fell out of its intensity period
        elif kind == "group":
            self.groups[str(record["group"])] = record
        else:
            self.marks.append(record)

    def records(self) -> list[dict[str, Any]]:
        """The snapshot: the marks and group epochs (every run's), then the last run."""
        out = [*self.marks, *self.groups.values()]
        out += [r for r in (self.app, self.stopped) if r is not None]  # one at most
        out += [*self.procs.values(), *self.actors.values()]
        for sup, times in self.restarts.items():
            out += [{"restart": sup, "at": at} for at in times]
        return out


def fold(records: list[dict[str, Any]]) -> JournalState:
    state = JournalState()
    for line, record in enumerate(records, 1):
        state.add(record, line)
    return state


def parse(data: bytes) -> list[dict[str, Any]]:
    """The records in journal bytes `data`, oldest first. The bytes after the last newline are
    a write the controller's death cut short and are dropped; any other line that is not a
    record this version understands is a TakeoverError that says which."""
    lines = data.split(b"\n")[:-1]  # the last piece: empty, or torn
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            raise TakeoverError(
                f"takeover: line {number} of the journal is not a JSON record: "
                f"{line[:200]!r}; the state directory is damaged: give this run a fresh one"
            ) from None
        record_kind(record, number)
        records.append(record)
    return records


def read_journal(root: Path) -> list[dict[str, Any]]:
    """The journal's records, oldest first (see ``parse``)."""
    path = root / JOURNAL
    if not path.exists():
        return []
    fd = open_private(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return parse(f.read())


class Journal:
    """The journal of one app run, appended to by its active controller (the module docstring
    tells the rules). `after` is the journal it continues, as read (a takeover), or None for a
    fresh one. It compacts past `compact_bytes`, unless a controller with an epoch above
    `epoch` took the directory over."""

    def __init__(
        self,
        root: Path,
        *,
        epoch: int,
        after: list[dict[str, Any]] | None = None,
        compact_bytes: int = COMPACT_BYTES,
    ) -> None:
        self._root, self._epoch, self._compact_bytes = root, epoch, compact_bytes
        self.state = fold(after or [])
        flags = os.O_RDWR | os.O_APPEND | (os.O_TRUNC if after is None else 0)
        self._fd = open_private(root / JOURNAL, flags)
        self._size = _cut_torn_tail(self._fd)  # our records must not follow a torn line
        self._base = 0  # the size of the last snapshot
        #: How many compactions ran, and how long each took (seconds): statistics.
        self.compactions: list[float] = []

    def append(self, record: dict[str, Any], *, durable: bool = False) -> None:
        self.state.add(record)
        line = encode(record)
        os.write(self._fd, line)  # O_APPEND, one write: lines never interleave
        if durable:
            os.fsync(self._fd)
        self._size += len(line)
        if self._size - self._base > max(self._compact_bytes, self._base):
            self.compact()

    def compact(self) -> None:
        """Rewrite the journal as its snapshot (atomically: a reader sees the old file or this
        one, never a mix), unless a newer controller's epoch is in the directory."""
        started = time.perf_counter()
        data = b"".join(encode(record) for record in self.state.records())
        tmp = self._root / _TMP
        tmp.unlink(missing_ok=True)
        fd = open_private(tmp, os.O_RDWR | os.O_APPEND | os.O_EXCL)
        try:
            os.write(fd, data)
            os.fsync(fd)
            newer = read_epoch(self._root)
            if newer > self._epoch:  # fenced: the journal is another controller's now
                log.warning("takeover: epoch %d took the journal over; not compacting", newer)
                self._compact_bytes = self._base = 1 << 62
                tmp.unlink(missing_ok=True)
                os.close(fd)
                return
            os.replace(tmp, self._root / JOURNAL)
        except BaseException:
            os.close(fd)
            raise
        fsync_dir(self._root)
        os.close(self._fd)
        self._fd, self._size, self._base = fd, len(data), len(data)
        self.compactions.append(time.perf_counter() - started)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _cut_torn_tail(fd: int) -> int:
    """Truncate the file at `fd` after its last newline (a torn write's bytes go); its size."""
    size = end = os.fstat(fd).st_size
    while end > 0:
        chunk = os.pread(fd, min(end, 4096), max(0, end - 4096))
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            end = end - len(chunk) + cut + 1
            break
        end -= len(chunk)
    if end != size:
        os.ftruncate(fd, end)
    return end
