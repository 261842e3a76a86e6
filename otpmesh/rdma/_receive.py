"""Warm memory for large values a node reads from another host (``tcp``, ``ibverbs``).

A value that cannot be mapped (its owner is on another host) is read into memory of the
receiver's. New memory costs more to fault in than the network costs to fill it (256 MiB here:
a fresh tensor fills at about 2 GB/s, a warm one at memory speed), so the receiver's node lends
out anonymous memory it keeps: a tensor (or numpy array, memoryview) that arrives this way lies
in a block of this pool, and when the last user of it is freed the block comes back, still
faulted in, for the next value it fits (at most its size, more than half of it). The block is
the receiver's own: nobody else maps it, so nothing is shared and nothing needs a lease.

Free blocks follow the snapshot pool's rules (``_pool.py``): closed after ``IDLE`` s unused, at
once past the ``OTPMESH_CHANNEL_POOL`` limit, and when the node stops; a block given back after
its node stopped (or its trio run ended) is unmapped at once.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
from collections.abc import Callable
from typing import Any

import trio

from ._pool import IDLE, log, pool_limit
from ._snapshot import _libc, _map

_PAGE = mmap.PAGESIZE


@functools.lru_cache(maxsize=64)
def _lent_type(nbytes: int) -> type[ctypes.Array[ctypes.c_char]]:
    base = ctypes.c_char * nbytes

    class Lent(base):  # type: ignore[valid-type,misc]
        """A block of a ``ReceivePool``: given back when the last tensor over it is freed."""

        give_back: Callable[[], None] | None = None

        def __del__(self) -> None:
            if self.give_back is not None:
                self.give_back()

    return Lent


class ReceivePool:
    """One node's warm receive memory: ``take`` a block for a value; it comes back by itself.
    `woken` is called (in the run's thread) when a block comes back, with when it is due to
    close, so the node's timer can close it then."""

    def __init__(
        self,
        woken: Callable[[float], None],
        limit: int | None = None,
        idle: float = IDLE,
    ) -> None:
        self.limit = pool_limit() if limit is None else limit
        self.idle = idle
        self._woken = woken
        self._free: list[tuple[int, int, float]] = []  # (address, capacity, since): oldest first
        self.closed = False
        self.reused = 0  # values read into a warm block (statistics)

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self, nbytes: int) -> Any:
        """A writable buffer of `nbytes` (``torch.frombuffer`` takes it) in a block of this pool:
        the smallest free one it fits, else a new one."""
        fits = [i for i, (_, cap, _) in enumerate(self._free) if nbytes <= cap < 2 * nbytes]
        if fits:
            address, capacity, _ = self._free.pop(min(fits, key=lambda i: self._free[i][1]))
            self.reused += 1
        else:
            capacity = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)
            address = _map(-1, capacity, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        memory: Any = _lent_type(nbytes).from_address(address)
        memory.give_back = self._giver(address, capacity)
        return memory

    def _giver(self, address: int, capacity: int) -> Callable[[], None]:
        token = trio.lowlevel.current_trio_token()

        def give_back() -> None:  # any thread, any time: where the garbage collector frees it
            try:
                token.run_sync_soon(self._returned, address, capacity)
            except trio.RunFinishedError:
                _libc.munmap(address, capacity)

        return give_back

    def _returned(self, address: int, capacity: int) -> None:
        try:  # in the run's thread: an exception here would end the whole run
            self._keep(address, capacity)
        except Exception:
            log.exception("tensor channel: a receive block could not be returned")

    def _keep(self, address: int, capacity: int) -> None:
        if self.closed or capacity > self.limit:
            _libc.munmap(address, capacity)
            return
        self._free.append((address, capacity, trio.current_time()))
        while sum(cap for _, cap, _ in self._free) > self.limit:  # the oldest go first
            old, old_capacity, _ = self._free.pop(0)
            _libc.munmap(old, old_capacity)
        self._woken(self.next_trim())

    def next_trim(self) -> float:
        """When the oldest free block is due to close (trio's clock), or inf."""
        return self._free[0][2] + self.idle if self._free else math.inf

    def trim(self, now: float = math.inf) -> None:
        """Unmap the free blocks unused for ``idle`` s by `now` (default: all of them)."""
        keep = []
        for address, capacity, since in self._free:
            if since + self.idle <= now:
                _libc.munmap(address, capacity)
            else:
                keep.append((address, capacity, since))
        self._free = keep

    def close(self) -> None:
        """The node stops: free blocks go now, lent ones when they come back."""
        self.closed = True
        self.trim()
