"""Following an app's event log on a display: the tree view and the recent events, drawn in
place on a terminal (``LiveDisplay``) or as lines (``PlainDisplay``).

``otpmesh run`` feeds it the log of the app it runs; ``otpmesh watch`` the entries it receives
from another process's app (whose clock it follows through ``offset``).
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import trio
from rich.console import RenderableType

from .._controller._events import EventLog
from .._core._outline import OutlineRow
from .._core._spec import Mesh, Supervisor
from . import _timeline
from ._screen import LiveScreen, fit, render, tree_table
from ._timeline import Event
from ._treeview import TreeView

REDRAW_EVERY = 0.1  # seconds: at most ten frames a second, however busy the log
CLOCK_EVERY = 1.0  # seconds: redraw at least this often, so the clock moves


class Watch:
    """The tree view and the recent events, kept up to date from an app's log."""

    def __init__(self, tree: Supervisor | Mesh | Sequence[OutlineRow], heading: str) -> None:
        self.view = TreeView(tree)
        self.title = heading
        self.recent: deque[Event] = deque(maxlen=100)
        self.t0: float | None = None
        self.log: EventLog | None = None  # the app's, once started (or a copy of it)
        self.offset = 0.0  # the app's clock minus this process's (another process's app)
        self.sections: list[tuple[str, list[str]]] = []  # more to show below the events
        self._seen = 0

    def now(self) -> float:
        """The app's clock now."""
        return trio.current_time() + self.offset

    def catch_up(self) -> list[Event]:
        """Feed the view what the log gained since the last call; return it as events."""
        log = self.log
        if log is None:
            return []
        new = [log[i] for i in range(self._seen, len(log))]
        self._seen += len(new)
        for entry in new:
            self.view.feed(entry)
        if new and self.t0 is None:
            self.t0 = new[0].time
        events = [Event.of(entry) for entry in new]
        self.recent.extend(events)
        return events

    def line(self, event: Event) -> str:
        return _timeline.line(event, self.t0 or 0.0)

    def heading(self) -> str:
        return self.title

    def snapshot(self, now: float | None = None) -> list[str]:
        return [self.view.summary(now), *self.view.lines()]


class Display(Protocol):
    def started(self, watch: Watch) -> None: ...
    def events(self, watch: Watch, new: list[Event]) -> None: ...
    async def run(self, watch: Watch) -> None: ...
    def stopping(self, watch: Watch, why: str) -> None: ...
    def finished(self, watch: Watch, new: list[Event]) -> None: ...


class PlainDisplay:
    """Lines for a pipe or a log file: the tree, events as they happen, the tree at the end."""

    def __init__(
        self, out: Callable[[str], None], every: float | None, what: str = "Ctrl-C stops it"
    ) -> None:
        self.out = out
        self.every = every
        self.what = what

    def started(self, watch: Watch) -> None:
        self.out(f"{watch.heading()}: started; {self.what}")
        self._tree(watch)

    def _tree(self, watch: Watch, now: float | None = None) -> None:
        for text in watch.snapshot(now):
            self.out(text)

    def events(self, watch: Watch, new: list[Event]) -> None:
        for event in new:
            self.out(watch.line(event))

    async def run(self, watch: Watch) -> None:
        while self.every is not None:
            await trio.sleep(self.every)
            self._tree(watch, watch.now())

    def stopping(self, watch: Watch, why: str) -> None:
        self.out(f"{watch.heading()}: stopping ({why})")

    def finished(self, watch: Watch, new: list[Event]) -> None:
        self.events(watch, new)
        self._tree(watch)


class LiveDisplay:
    """The tree redrawn in place on a terminal, with the recent events and output below it. It
    keeps redrawing while the tree shuts down, so a slow stop shows who is still running."""

    def __init__(self, hint: str = "    Ctrl-C stops the tree") -> None:
        self.screen = LiveScreen(sys.stdout)
        self.changed = trio.Event()
        self.hint = hint

    def started(self, watch: Watch) -> None:
        self.screen.open()
        self._draw(watch)

    def _frame(self, watch: Watch, rows: int | None, keep: int) -> RenderableType:
        now = watch.now()
        table = watch.view.table(now)
        events = [watch.line(e) for e in list(watch.recent)[-keep:]]
        output = list(self.screen.tail.lines)[-keep:]
        top = 2 + len(table)  # the heading, the summary, the table's header and rows
        sections = fit(top, [("recent events", events), ("output", output), *watch.sections], rows)
        hint = self.hint if rows is not None else ""
        return render(watch.heading(), hint, watch.view.summary(now), tree_table(table), sections)

    def _draw(self, watch: Watch) -> None:
        watch.catch_up()  # also while the tree stops, when nothing else follows the log
        rows, _ = self.screen.size()
        self.screen.draw(self._frame(watch, rows, keep=rows))

    def events(self, watch: Watch, new: list[Event]) -> None:
        self.changed.set()

    async def run(self, watch: Watch) -> None:
        while True:
            self._draw(watch)
            with trio.move_on_after(CLOCK_EVERY):
                await self.changed.wait()
            self.changed = trio.Event()
            await trio.sleep(REDRAW_EVERY)

    def stopping(self, watch: Watch, why: str) -> None:
        self.hint = f"    stopping ({why})"
        self.changed.set()

    def finished(self, watch: Watch, new: list[Event]) -> None:
        self.screen.close(self._frame(watch, None, keep=10))
