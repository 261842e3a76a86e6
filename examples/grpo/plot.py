"""A tiny PNG line plot (zlib + struct, no plotting library): the reward curve on [0, 1].

A title, axis labels, gridlines at every 0.25 of reward, labels in a 3x5 pixel font (capitals,
digits), the curve in blue, a red tick under every iteration that saw a restart, and a legend
saying so. No plotting library: the example stays free of dependencies beyond torch.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

Color = tuple[int, int, int]
Pixels = list[bytearray]
WHITE, GREY, BLACK, BLUE, RED = (255,) * 3, (215,) * 3, (0,) * 3, (31, 90, 180), (210, 40, 40)
# Digits and '.' as 3x5 bitmaps, row by row.
FONT = {
    "0": "111101101101111",
    "1": "010110010010111",
    "2": "111001111100111",
    "3": "111001111001111",
    "4": "101101111001001",
    "5": "111100111001111",
    "6": "111100111101111",
    "7": "111001001001001",
    "8": "111101111101111",
    "9": "111101111001111",
    ".": "000000000000010",
    "-": "000000111000000",
    " ": "000000000000000",
    "A": "010101111101101",
    "C": "011100100100011",
    "D": "110101101101110",
    "E": "111100110100111",
    "G": "011100101101011",
    "H": "101101111101101",
    "I": "111010010010111",
    "M": "101111101101101",
    "N": "110101101101101",
    "O": "111101101101111",
    "P": "110101110100100",
    "R": "110101110101101",
    "S": "011100010001110",
    "T": "111010010010010",
    "U": "101101101101111",
    "W": "101101101111101",
}
SCALE = 2  # font pixels per bitmap pixel


def encode_png(rows: Pixels) -> bytes:
    """8-bit RGB PNG bytes of `rows` (equal-length RGB byte rows), unfiltered."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", len(rows[0]) // 3, len(rows), 8, 2, 0, 0, 0)
    raw = b"".join(b"\x00" + bytes(row) for row in rows)  # filter type 0 on every row
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def _dot(rows: Pixels, x: int, y: int, color: Color) -> None:
    if 0 <= y < len(rows) and 0 <= x < len(rows[0]) // 3:
        rows[y][3 * x : 3 * x + 3] = bytes(color)


def _line(rows: Pixels, a: tuple[int, int], b: tuple[int, int], color: Color) -> None:
    """A 2-pixel-thick straight line from `a` to `b`."""
    steps = max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1)
    for i in range(steps + 1):
        x = round(a[0] + (b[0] - a[0]) * i / steps)
        y = round(a[1] + (b[1] - a[1]) * i / steps)
        for dx, dy in ((0, 0), (1, 0), (0, 1), (1, 1)):
            _dot(rows, x + dx, y + dy, color)


def _text(
    rows: Pixels, text: str, right: int, middle: int, scale: int = SCALE, color: Color = BLACK
) -> None:
    """`text` (capitals, digits, '.', '-', ' '), its right edge at x=`right`, centered
    vertically on y=`middle`."""
    x0 = right - len(text) * 4 * scale
    for n, char in enumerate(text.upper()):
        for bit, on in enumerate(FONT[char]):
            if on == "1":
                for dx, dy in itertools.product(range(scale), repeat=2):
                    x = x0 + (4 * n + bit % 3) * scale + dx
                    _dot(rows, x, middle + (bit // 3 - 2) * scale + dy, color)


def text_width(text: str, scale: int = SCALE) -> int:
    return len(text) * 4 * scale


def render(
    ys: Sequence[float],
    marks: Iterable[int] = (),
    title: str = "",
    width: int = 640,
    height: int = 400,
) -> Pixels:
    """The plot as RGB rows: `ys` over their index, y from 0 (bottom) to 1 (top)."""
    rows = [bytearray(bytes(WHITE) * width) for _ in range(height)]
    left, right, top, bottom = 48, width - 28, 60, height - 60

    def to_xy(i: float, y: float) -> tuple[int, int]:
        span = max(len(ys) - 1, 1)
        return round(left + (right - left) * i / span), round(bottom - (bottom - top) * y)

    _text(rows, title, (width + text_width(title, 3)) // 2, 18, scale=3)
    _text(rows, "MEAN REWARD", left + text_width("MEAN REWARD") - 16, top - 18)
    for quarter in range(5):
        _, y = to_xy(0, quarter / 4)
        _line(rows, (left, y), (right, y), BLACK if quarter == 0 else GREY)
        _text(rows, f"{quarter / 4:g}", left - 8, y)
    _line(rows, (left, top), (left, bottom), BLACK)
    for i in (0, len(ys) - 1):
        x, _ = to_xy(i, 0)
        _text(rows, str(i), x + text_width(str(i)) // 2, bottom + 26)
    _text(rows, "ITERATION", (left + right + text_width("ITERATION")) // 2, bottom + 26)
    marks = list(marks)
    for i in marks:
        x, _ = to_xy(i, 0)
        _line(rows, (x, bottom + 4), (x, bottom + 12), RED)
    # The legend, bottom right: a sample of each mark and what it means.
    legend = [(BLUE, "REWARD"), *([(RED, "RESTART")] if marks else [])]
    x = right
    for color, label in reversed(legend):
        _text(rows, label, x, bottom + 48)
        x -= text_width(label) + 8
        _line(rows, (x - 14, bottom + 47), (x, bottom + 47), color)
        x -= 30
    points = [to_xy(i, min(max(y, 0.0), 1.0)) for i, y in enumerate(ys)]
    for a, b in itertools.pairwise(points):
        _line(rows, a, b, BLUE)
    return rows


def write_line_plot(
    path: Path, ys: Sequence[float], marks: Iterable[int] = (), title: str = ""
) -> None:
    """Write the plot of `ys` (see ``render``) to `path` as a PNG."""
    path.write_bytes(encode_png(render(ys, marks, title)))
