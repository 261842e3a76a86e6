"""A live view in a terminal: frames redrawn in place on the alternate screen (as ``top`` does).

While the view owns the terminal, what the program and its workers print is kept (``OutputTail``)
and shown in the frame instead of scrolling the screen; the final frame stays on the normal screen
when the view closes.
"""

from __future__ import annotations

import io
import shutil
import sys
from collections import deque
from collections.abc import Sequence
from typing import TextIO

_ALT_SCREEN_ON, _ALT_SCREEN_OFF = "\x1b[?1049h", "\x1b[?1049l"
_CURSOR_OFF, _CURSOR_ON = "\x1b[?25l", "\x1b[?25h"
_HOME, _CLEAR_LINE, _CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"


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


def frame(
    top: Sequence[str],
    sections: Sequence[tuple[str, Sequence[str]]],
    rows: int | None = None,
    cols: int | None = None,
) -> list[str]:
    """`top` lines, then each (title, lines) section that has lines. When `rows` is too few,
    small sections are shown whole and the others share the rest, each keeping its last lines;
    every line is cut to `cols`."""
    out = list(top)
    wanted = [(title, list(lines)) for title, lines in sections if lines]
    needs = [len(lines) + 2 for _, lines in wanted]  # a blank line and the title, then the lines
    if rows is not None:
        needs = _share(needs, rows - len(out) - 1)  # the last row stays free: no scrolling
    for (title, lines), room in zip(wanted, needs, strict=True):
        if room > 2:
            out += ["", title, *lines[2 - room :]]
    if rows is not None:
        out = out[: rows - 1]
    return out if cols is None else [line[: cols - 1] for line in out]


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


class LiveScreen:
    """Owns the terminal from ``open()`` to ``close()``: draws frames in place, and keeps the
    program's own output (``sys.stdout``/``sys.stderr``, which worker output goes to) in
    ``tail`` instead of letting it scroll the frame away."""

    def __init__(self, terminal: TextIO) -> None:
        self.terminal = terminal
        self.tail = OutputTail()
        self._saved: tuple[TextIO, TextIO] | None = None

    def size(self) -> tuple[int, int]:
        cols, rows = shutil.get_terminal_size()
        return rows, cols

    def open(self) -> None:
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = sys.stderr = self.tail
        self.terminal.write(_ALT_SCREEN_ON + _CURSOR_OFF)
        self.terminal.flush()

    def draw(self, lines: Sequence[str]) -> None:
        body = "".join(line + _CLEAR_LINE + "\n" for line in lines)
        self.terminal.write(_HOME + body + _CLEAR_BELOW)
        self.terminal.flush()

    def close(self, final: Sequence[str]) -> None:
        """Back to the normal screen, where `final` stays; restore the program's streams."""
        if self._saved is None:
            return
        sys.stdout, sys.stderr = self._saved
        self._saved = None
        self.terminal.write(_CURSOR_ON + _ALT_SCREEN_OFF)
        self.terminal.write("".join(line + "\n" for line in final))
        self.terminal.flush()
