"""Event logs as a timeline: one line per entry, from a running app or a recorded JSONL file.

A recorded log is what ``otpmesh.start(tree, events_file=f)`` writes: one JSON object per line
with ``time``, ``kind``, ``path``, ``child``, ``incarnation``, ``reason`` (in words) and
``reason_repr``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .._core._errors import UsageError
from .._core._supevents import LogEntry, LogKind

KINDS = tuple(str(k) for k in LogKind)


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of an event log, its reason already in words."""

    time: float
    kind: str
    path: str
    child: str | None = None
    incarnation: int | None = None
    reason: str | None = None

    @property
    def child_path(self) -> str:
        return f"{self.path}/{self.child}" if self.child is not None else self.path

    @classmethod
    def of(cls, entry: LogEntry) -> Event:
        return cls(
            entry.time,
            str(entry.kind),
            entry.path,
            entry.child,
            entry.incarnation,
            entry.reason_text(),
        )


def line(event: Event, t0: float) -> str:
    """``   1.234 s  child_exited              rl/rollouts/2 #1  (crashed with ...)``."""
    incarnation = "" if event.incarnation is None else f" #{event.incarnation}"
    reason = "" if event.reason is None else f"  ({event.reason})"
    return f"{event.time - t0:9.3f} s  {event.kind:<26}{event.child_path}{incarnation}{reason}"


def matches(event: Event, paths: Iterable[str], kinds: Iterable[str]) -> bool:
    """An event is shown when its child path is under one of `paths` and its kind is in `kinds`
    (an empty filter lets everything through)."""
    paths, kinds = list(paths), list(kinds)
    if kinds and event.kind not in kinds:
        return False
    where = event.child_path
    prefixes = [p.rstrip("/") for p in paths]
    return not paths or any(where == p or where.startswith(p + "/") for p in prefixes)


def check_kinds(kinds: Iterable[str]) -> list[str]:
    """The kinds asked for, each one checked against the log's vocabulary."""
    asked = [k.strip() for k in kinds if k.strip()]
    unknown = [k for k in asked if k not in KINDS]
    if unknown:
        raise UsageError(f"unknown event kind {unknown[0]!r}; the kinds are: {', '.join(KINDS)}")
    return asked


def parse(text: str, where: str) -> Event:
    """One line of a recorded log; `where` ('events.jsonl:3') names it in the error."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{where}: not an event (a JSON object), got {type(data).__name__}")
    for name, types in _FIELDS.items():
        value = data.get(name)
        if not isinstance(value, types) or isinstance(value, bool):
            allowed = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            seen = "missing" if name not in data else json.dumps(value)
            raise UsageError(f"{where}: field {name!r} is {seen}; expected {allowed}")
    return Event(
        float(data["time"]),
        data["kind"],
        data["path"],
        data.get("child"),
        data.get("incarnation"),
        data.get("reason"),
    )


_FIELDS: dict[str, tuple[type, ...]] = {
    "time": (int, float),
    "kind": (str,),
    "path": (str,),
    "child": (str, type(None)),
    "incarnation": (int, type(None)),
    "reason": (str, type(None)),
}


def read(lines: Iterable[str], name: str, first: int = 1) -> Iterator[Event]:
    """The events of a recorded log's lines (blank lines skipped); line numbers from `first`."""
    for number, text in enumerate(lines, first):
        if text.strip():
            yield parse(text, f"{name}:{number}")
