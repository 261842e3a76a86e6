"""The takeover journal's records and what they fold to (pure: no I/O; _journal.py writes and
reads the file). The records, by the key that names their kind:

- ``app``: a run's start (its secret, epoch); everything of the run follows it.
- ``proc`` / ``exited``: a worker process started (pid, address, rank, coords) / is gone.
- ``actor``: an actor started (its incarnation, the process it runs in).
- ``restart``: a supervisor restarted a child (``at``: wall-clock seconds; ``mono``: the
  host's monotonic clock, which the app record's ``boot`` says which boot of it; ``window``:
  how many of its restarts, this one included, are still inside its intensity period, all a
  later intensity check can count).
- ``agent_token``: the one-time registration tokens of the host agent of a rank (hex): the one
  it holds for its next registration and the one it presented last. A standby registers a
  rank's agent only with one of them (docs/security.md).
- ``group``: a process group's epoch. ``chaos``: a controller kill ``otpmesh.chaos`` threw.
- ``stopped``: the run stopped in order: nothing to take over.

A record whose kind the reader does not know is an error, never skipped: a journal from another
version of otpmesh must not be half understood.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .._core._errors import TakeoverError

Stamp = tuple[float, float | None]
"""A restart's time: wall-clock seconds, and the host's monotonic seconds (None: unknown)."""

#: The record kinds, by the key that names each; the order matters where records share keys
#: (an ``actor`` record names its ``proc`` too).
KINDS = ("app", "stopped", "actor", "proc", "exited", "restart", "agent_token", "group", "chaos")


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
    restarts: dict[str, list[Stamp]] = field(default_factory=dict)
    #: The last run's agent tokens, by rank: the last record of each.
    tokens: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Every run's last epoch of each process group, by path, and chaos's marks.
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    marks: list[dict[str, Any]] = field(default_factory=list)

    def add(self, record: dict[str, Any], line: int = 0) -> None:
        kind = record_kind(record, line)
        if kind in ("app", "stopped"):
            self.app, self.stopped = (record, None) if kind == "app" else (None, record)
            self.procs, self.actors, self.restarts, self.tokens = {}, {}, {}, {}
        elif kind == "actor":
            self.actors[str(record["actor"])] = record
        elif kind == "proc":
            self.procs[str(record["proc"])] = record
        elif kind == "exited":
            self.procs.pop(str(record["exited"]), None)
        elif kind == "restart":
            times = self.restarts.setdefault(str(record["restart"]), [])
            mono = record.get("mono")
            times.append((float(record["at"]), None if mono is None else float(mono)))
            window = record.get("window")
            if isinstance(window, int) and not isinstance(window, bool) and window > 0:
                del times[:-window]  # the older ones fell out of its intensity period
        elif kind == "agent_token":
            self.tokens[int(record["agent_token"])] = record
        elif kind == "group":
            self.groups[str(record["group"])] = record
        else:
            self.marks.append(record)

    def records(self) -> list[dict[str, Any]]:
        """The snapshot: the marks and group epochs (every run's), then the last run."""
        out = [*self.marks, *self.groups.values()]
        out += [r for r in (self.app, self.stopped) if r is not None]  # one at most
        out += [*self.procs.values(), *self.actors.values(), *self.tokens.values()]
        for sup, times in self.restarts.items():
            for at, mono in times:
                out.append({"restart": sup, "at": at, **({} if mono is None else {"mono": mono})})
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
