"""Short reprs of received values, for error messages: bounded in time and memory whatever
arrived."""

from __future__ import annotations

import reprlib
from typing import Any


class _Brief(reprlib.Repr):
    """reprlib, but bytes are cut before they are repr'd (reprlib would repr them whole)."""

    def repr_bytes(self, x: bytes, level: int) -> str:
        cut = x[: self.maxstring]
        return repr(cut) + ("..." if len(x) > len(cut) else "")

    repr_bytearray = repr_bytes


_BRIEF = _Brief()
_BRIEF.maxstring = _BRIEF.maxother = _BRIEF.maxlong = 80


def brief(value: Any) -> str:
    """A short repr of a received value for an error message, in bounded time and memory."""
    return _BRIEF.repr(value)
