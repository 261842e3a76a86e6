"""The msgpack packers the codec keeps, one per nesting level in each thread (``Packer``,
``ThreadPackers``): a packer per call would allocate a 256 KiB buffer each time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack

from ._tensors import PLAIN

#: The codec's hook for what msgpack cannot pack itself: (the packer, the value) -> what to pack.
Hook = Callable[["Packer", Any], Any]


class Packer:
    """A msgpack packer kept for one nesting level in one thread, and the packing it serves
    now. ``msgpack.packb`` makes a packer per call, and each allocates a 256 KiB buffer: that
    was the largest single cost of a call on the hot path (docs/architecture.md, "What a call
    costs"); a kept one costs a tenth of it."""

    __slots__ = ("busy", "how", "level", "pack")

    def __init__(self, level: int, hook: Hook) -> None:
        self.level = level
        self.how = PLAIN
        self.busy = False  # packing now: a hook packing again at this level gets its own
        default = partial(hook, self)  # msgpack's hook for what it cannot pack itself
        self.pack = msgpack.Packer(default=default, strict_types=True, use_bin_type=True).pack


# A packer's buffer keeps the size of the largest value it packed: one that grew past msgpack's
# initial 256 KiB is dropped, so no thread holds a frame's worth of memory after a big message.
KEEP_PACKER_BELOW = 256 << 10


class ThreadPackers(threading.local):
    """Each thread's packers, one per nesting level (0 to `levels`)."""

    def __init__(self, levels: int, hook: Hook) -> None:
        self.by_level = [Packer(level, hook) for level in range(levels + 1)]
