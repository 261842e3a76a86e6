"""The live view on a terminal, drawn with rich: a ``rich.live.Live`` on the alternate screen (as
``top`` does), redrawn in place from the tree's rows.

While the view owns the terminal, what the program and its workers print is kept (``OutputTail``)
and shown in the frame instead of scrolling the screen; the final frame stays on the normal screen
when the view closes. ``fit`` (which lines fit) is pure; ``render`` turns rows and lines into rich
renderables; ``LiveScreen`` is the only part that touches the terminal.
"""

from __future__ import annotations

import io
import sys
from collections import deque
from collections.abc import Sequence
from typing import TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from . import _treeview as tv

STATE_STYLES = {
    tv.STARTING: "yellow",
    tv.RUNNING: "green",
    tv.RESTARTING: "yellow",
    tv.EXITED: "red",
    tv.START_FAILED: "red",
    tv.GAVE_UP: "bold red",
    tv.ESCALATING: "bold red",
    tv.STOPPED: "dim",
    tv.IGNORED: "dim",
    tv.AUTO_SHUTDOWN: "dim",
}
EVENT_STYLES = {"child_exited": "red", "start_failed": "red", "fault_injected": "magenta"}


class OutputTail(io.TextIOBase):
    """A text stream that keeps the last `keep` lines written to it."""

    def __init__(self, keep: int = 200) -> None:
        super().__init__()
        self.lines: deque[str] = deque(maxlen=keep)
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *complete, self._partial = (self._partial + text).split("\n")
        self.lines.extend(line.rstrip("\r") for line in complete)
        return len(text)

    def flush(self) -> None:
        pass


Section = tuple[str, list[str]]


def fit(top: int, sections: Sequence[tuple[str, Sequence[str]]], rows: int | None) -> list[Section]:
    """The (title, lines) sections that have lines and room below `top` rows, each as a blank
    line, its title and its last lines. When `rows` is too few, small sections are shown whole
    and the others share the rest; the last row stays free."""
    wanted = [(title, list(lines)) for title, lines in sections if lines]
    needs = [len(lines) + 2 for _, lines in wanted]  # a blank line and the title, then the lines
    if rows is not None:
        needs = _share(needs, rows - top - 1)
    return [
        (title, lines[2 - room :])
        for (title, lines), room in zip(wanted, needs, strict=True)
        if room > 2
    ]


def _share(needs: list[int], budget: int) -> list[int]:
    """Rows for each need: whole where it fits an equal share, the rest split evenly."""
    room = [0] * len(needs)
    left = list(range(len(needs)))
    while left and budget > 0:
        share = budget // len(left)
        small = [i for i in left if needs[i] <= share]
        if not small:
            for i in left:
                room[i] = share
            break
        for i in small:
            room[i] = needs[i]
            budget -= needs[i]
            left.remove(i)
    return room


def tree_table(rows: Sequence[tuple[str, ...]]) -> Table:
    """``TreeView.table()`` rows as a rich table: one line per node, the state in colour. On a
    narrow terminal only LAST EXIT gives way, its text cut with an ellipsis rather than wrapped."""
    header, *body = rows
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for name in header:
        # rich narrows the columns that may wrap; the cells themselves never do (no_wrap Text)
        table.add_column(Text(name, no_wrap=True, overflow="ellipsis"), no_wrap=name != "LAST EXIT")
    state = header.index("STATE")
    for row in body:
        cells = [Text(cell, no_wrap=True, overflow="ellipsis") for cell in row]
        cells[state].stylize(STATE_STYLES.get(row[state], ""))
        table.add_row(*cells)
    return table


def render(heading: str, hint: str, summary: str, table: Table, sections: list[Section]) -> Group:
    """One frame: the heading, the summary line, the tree, then each titled section."""
    parts: list[RenderableType] = [
        Text.assemble((heading, "bold"), (hint, "dim"), no_wrap=True, overflow="ellipsis"),
        Text(summary, no_wrap=True, overflow="ellipsis"),
        table,
    ]
    for title, lines in sections:
        parts += [Text(""), Text(title, style="bold")]
        parts += [_line(line) for line in lines]
    return Group(*parts)


def _line(line: str) -> Text:
    words = line.split(maxsplit=3)
    kind = words[2] if len(words) > 2 else ""
    return Text(line, style=EVENT_STYLES.get(kind, ""), no_wrap=True, overflow="ellipsis")


class LiveScreen:
    """Owns the terminal from ``open()`` to ``close()``: draws frames in place, and keeps the
    program's own output (``sys.stdout``/``sys.stderr``, which worker output goes to) in
    ``tail`` instead of letting it scroll the frame away."""

    def __init__(self, terminal: TextIO) -> None:
        self.console = Console(file=terminal)
        self.tail = OutputTail()
        self._live: Live | None = None
        self._saved: tuple[TextIO, TextIO] | None = None

    def size(self) -> tuple[int, int]:
        cols, rows = self.console.size
        return rows, cols

    def open(self) -> None:
        # auto_refresh off: frames are drawn by the caller's trio task, not by a thread.
        self._live = Live(
            console=self.console,
            screen=True,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = sys.stderr = self.tail

    def draw(self, frame: RenderableType) -> None:
        if self._live is not None:
            self._live.update(frame, refresh=True)

    def close(self, final: RenderableType) -> None:
        """Back to the normal screen, where `final` stays; restore the program's streams."""
        if self._live is None or self._saved is None:
            return
        sys.stdout, sys.stderr = self._saved
        self._saved = None
        self._live.stop()
        self._live = None
        self.console.print(final)
