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
- ``tree`` / ``changed``: a supervisor's child list, whole / what changed in it, at the end of
  each of its operations (_core/_livetree.py): what a standby resumes each supervisor from.
- ``owned`` / ``owned_done``: a tree an actor started (its root's path, owner, spec and key:
  _controller/_ownedover.py) / its end.
- ``group``: a process group's epoch. ``chaos``: a controller kill ``otpmesh.chaos`` threw.
- ``stopped``: the run stopped in order: nothing to take over.
- ``gap``: the run could not journal everything (``why``: a full disk, an I/O error): it
  cannot be taken over, and a standby starts the tree afresh. Its controller writes the journal
  whole again, as a snapshot, once it can.

A record whose kind the reader does not know is an error, never skipped: a journal from another
version of otpmesh must not be half understood. So is a record whose fields are not what its
kind says (``FIELDS``): the readers get typed, valid records or a TakeoverError that names the
line, never a KeyError or a ValueError from deep in a takeover.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from .._core._errors import TakeoverError
from .._core._livetree import LiveTree, valid_rows

Stamp = tuple[float, float | None]
"""A restart's time: wall-clock seconds, and the host's monotonic seconds (None: unknown)."""

#: The record kinds, by the key that names each; the order matters where records share keys
#: (an ``actor`` record names its ``proc`` too).
KINDS = (
    "app",
    "stopped",
    "gap",
    "actor",
    "proc",
    "exited",
    "restart",
    "agent_token",
    "tree",
    "changed",
    "owned_done",
    "owned",
    "group",
    "chaos",
)
#: The kinds that begin a run, or say there is none to take over.
RUNS = ("app", "stopped", "gap")

Check = tuple[Callable[[Any], bool], str]
"""A field's test and what it says the field must be."""


def _hex(value: Any) -> bool:
    try:
        bytes.fromhex(value)
    except (TypeError, ValueError):
        return False
    return True


INT: Check = (lambda v: type(v) is int, "an int")  # bool is not one, nor 3.0
POSITIVE: Check = (lambda v: type(v) is int and v > 0, "a positive int")
NUMBER: Check = (lambda v: type(v) in (int, float) and math.isfinite(v), "a finite number")
TEXT: Check = (lambda v: type(v) is str, "a string")
HEX: Check = (lambda v: type(v) is str and _hex(v), "a hex string")
ROWS: Check = (valid_rows, "a list of child rows [id, status, incarnation(, spec)]")
IDS: Check = (lambda v: type(v) is list and all(type(i) is str for i in v), "a list of ids")
GIVEN: Check = (
    lambda v: type(v) is dict and all(type(n) is int and n > 0 for n in v.values()),
    "a map of ids to positive ints",
)
COORDS: Check = (
    lambda v: type(v) is dict and all(type(k) is str and type(n) is int for k, n in v.items()),
    "a map of names to ints",
)

#: Each kind's fields: name -> (what it must be, whether every record of the kind has it).
#: Fields not named here are kept and not looked at (an older version's ``secret``).
FIELDS: dict[str, dict[str, tuple[Check, bool]]] = {
    "app": {
        "app": (INT, True),
        "epoch": (INT, True),
        "boot": (TEXT, False),
        **{name: (HEX, False) for name in ("salt", "wrapped", "tag")},
    },
    "stopped": {"stopped": (INT, True)},
    "gap": {"gap": (INT, True), "why": (TEXT, False)},
    "actor": {"actor": (TEXT, True), "incarnation": (POSITIVE, True), "proc": (TEXT, True)},
    "proc": {
        "proc": (TEXT, True),
        "pid": (INT, True),
        "addr": (TEXT, True),
        "rank": (INT, True),
        "coords": (COORDS, True),
    },
    "exited": {"exited": (TEXT, True)},
    "restart": {
        "restart": (TEXT, True),
        "at": (NUMBER, True),
        "mono": (NUMBER, False),
        "window": (POSITIVE, False),
    },
    "agent_token": {"agent_token": (INT, True), "next": (HEX, True), "presented": (HEX, False)},
    "tree": {
        "tree": (TEXT, True),
        "incarnation": (POSITIVE, True),
        "children": (ROWS, True),
        "given": (GIVEN, False),
    },
    "changed": {
        "changed": (TEXT, True),
        "incarnation": (POSITIVE, True),
        "rows": (ROWS, True),
        "deleted": (IDS, True),
        "given": (GIVEN, False),
    },
    "owned": {
        "owned": (TEXT, True),
        "owner": (TEXT, True),
        "spec": (TEXT, True),
        "key": (HEX, True),
    },
    "owned_done": {"owned_done": (TEXT, True)},
    "group": {"group": (TEXT, True), "epoch": (INT, True)},
    "chaos": {
        "chaos": (TEXT, True),
        "pid": (INT, True),
        "step": (INT, False),
        "index": (INT, False),
        "plan": (TEXT, False),
    },
}


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


def check(record: object, line: int) -> str:
    """The kind of `record`, read from journal line `line`, once each of its fields is what the
    kind says (``FIELDS``); a TakeoverError that names the line and the field if not."""
    kind = record_kind(record, line)
    fields = cast(dict[str, Any], record)  # record_kind found a kind's key in it: a dict
    for name, test, what, required in _CHECKS[kind]:
        value = fields.get(name, _MISSING)
        if value is _MISSING and not required:
            continue
        if value is _MISSING or not test(value):
            seen = "missing" if value is _MISSING else f"{value!r:.60}"
            raise TakeoverError(
                f"takeover: line {line} of the journal: the {kind!r} record's {name!r} is {seen}, "
                f"not {what}: {json.dumps(fields)[:200]}; the state directory is damaged or "
                "was written by another program: give this run a fresh one"
            )
    return kind


_MISSING = object()
#: FIELDS, flat: (name, test, what, required) for each field of each kind.
_CHECKS = {
    kind: tuple((name, test, what, required) for name, ((test, what), required) in named.items())
    for kind, named in FIELDS.items()
}


def encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":")) + "\n").encode()


@dataclass
class JournalState:
    """What the journal's records, folded oldest first, still say is true. Its ``records()``
    fold to an equal state: they are the journal's snapshot."""

    #: The last run's app record; None when there is none, it stopped in order or it could
    #: not journal everything (its ``gap`` record then).
    app: dict[str, Any] | None = None
    stopped: dict[str, Any] | None = None
    gap: dict[str, Any] | None = None
    #: The last run's live worker processes, by proc id.
    procs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The last run's last start of each actor, by path.
    actors: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The last run's restart times (wall clock, oldest first) each supervisor may still count.
    restarts: dict[str, list[Stamp]] = field(default_factory=dict)
    #: The last run's agent tokens, by rank: the last record of each.
    tokens: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: The last run's supervisors' child lists.
    live: LiveTree = field(default_factory=LiveTree)
    #: The last run's trees that actors own, running, by root path, in the order started.
    owned: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Every run's last epoch of each process group, by path, and chaos's marks.
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    marks: list[dict[str, Any]] = field(default_factory=list)

    def add(self, record: dict[str, Any], line: int = 0) -> None:
        kind = record_kind(record, line)
        if kind in RUNS:
            self.app, self.stopped, self.gap = (record if kind == k else None for k in RUNS)
            self.procs, self.actors, self.restarts, self.tokens = {}, {}, {}, {}
            self.live, self.owned = LiveTree(), {}
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
        elif kind in ("tree", "changed"):
            self.live.add(record)
        elif kind == "owned":
            self.owned.pop(str(record["owned"]), None)  # started again: last in the order
            self.owned[str(record["owned"])] = record
        elif kind == "owned_done":
            self.owned.pop(str(record["owned_done"]), None)
        elif kind == "group":
            self.groups[str(record["group"])] = record
        else:
            self.marks.append(record)

    def records(self) -> list[dict[str, Any]]:
        """The snapshot: the marks and group epochs (every run's), then the last run."""
        out = [*self.marks, *self.groups.values()]
        out += [r for r in (self.app, self.stopped, self.gap) if r is not None]  # one at most
        out += [*self.procs.values(), *self.actors.values(), *self.tokens.values()]
        out += [*self.owned.values(), *self.live.records()]
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
    """The records in journal bytes `data`, oldest first, each checked (``check``).

    A write cut short ends what the journal can vouch for: the bytes after the last newline (the
    controller died in a write), or a line that is a record cut short with the next one glued
    to it (a full disk cut a write short and an older otpmesh appended on): the records are read
    up to the last complete one before it, and the rest is dropped. Any other line that is not a
    record this version understands is a TakeoverError that says which, and what is wrong."""
    lines = data.split(b"\n")[:-1]  # the last piece: empty, or torn
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            if _glued(line):
                break
            raise TakeoverError(
                f"takeover: line {number} of the journal is not a JSON record: "
                f"{line[:200]!r}; the state directory is damaged: give this run a fresh one"
            ) from None
        check(record, number)
        records.append(record)
    return records


#: How many places in a torn line ``_glued`` tries for the start of the record glued to it: the
#: piece before it is a prefix of one record, which opens a few objects at most.
_GLUE_TRIES = 8


def _glued(line: bytes) -> bool:
    """Whether `line` is a record cut short followed by a whole one: ``{"proc":"p1","pi`` then
    ``{"actor":...}``."""
    start = 0
    for _ in range(_GLUE_TRIES if line.startswith(b"{") else 0):
        start = line.find(b'{"', start + 1)
        if start < 0:
            return False
        try:
            record = json.loads(line[start:])
        except ValueError:
            continue
        return isinstance(record, dict) and any(kind in record for kind in KINDS)
    return False
