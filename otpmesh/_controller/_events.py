"""The application's event log: every supervision step, readable as a list, subscribable as an
async iterator, and written as JSON lines to a file when asked."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterator
from typing import IO, Any

import trio

from .._core._supevents import LogEntry


def entry_to_json(entry: LogEntry) -> dict[str, Any]:
    """One event as JSON data: reasons as words (and their repr, for tools)."""
    return {
        "time": entry.time,
        "kind": str(entry.kind),
        "path": entry.path,
        "child": entry.child,
        "incarnation": entry.incarnation,
        "reason": entry.reason_text(),
        "reason_repr": None if entry.reason is None else repr(entry.reason),
    }


class EventLog:
    """Append-only; ``list(app.events)`` reads it, ``async for e in app.events.subscribe()``
    follows it from now on."""

    def __init__(self, sink: IO[str] | None = None) -> None:
        self._entries: list[LogEntry] = []
        self._subscribers: list[trio.MemorySendChannel[LogEntry]] = []
        self._sink = sink

    def append(self, entry: LogEntry) -> None:
        self._entries.append(entry)
        if self._sink is not None:
            self._sink.write(json.dumps(entry_to_json(entry)) + "\n")
            self._sink.flush()
        for send in list(self._subscribers):
            try:
                send.send_nowait(entry)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.remove(send)

    async def subscribe(self) -> AsyncIterator[LogEntry]:
        """Every event appended from now on, until the application stops."""
        send, receive = trio.open_memory_channel[LogEntry](math.inf)
        self._subscribers.append(send)
        try:
            async with receive:
                async for entry in receive:
                    yield entry
        finally:
            if send in self._subscribers:
                self._subscribers.remove(send)

    def close(self) -> None:
        for send in self._subscribers:
            send.close()
        self._subscribers.clear()

    def __iter__(self) -> Iterator[LogEntry]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index: int) -> LogEntry:
        return self._entries[index]

    def of_kind(self, kind: str) -> list[LogEntry]:
        return [e for e in self._entries if e.kind == kind]
