"""Faults otpmesh.chaos puts on a node's links: extra latency, lost messages, a partition."""

from __future__ import annotations

import math

import trio


class LinkFaults:
    """Per peer address: (extra latency, until); an infinite latency drops. And a partition."""

    def __init__(self) -> None:
        self.links: dict[str, tuple[float, float]] = {}
        self._cut_off_until = -math.inf

    def add(self, addr: str, delay: float, seconds: float) -> None:
        """Delay (or, with an infinite delay, drop) calls and casts to `addr` for `seconds`."""
        self.links[addr] = (delay, trio.current_time() + seconds)

    def cut_off(self, seconds: float) -> None:
        """Partition the node for `seconds`: every call, cast and reply it sends or receives is
        lost. Node operations (supervision's own messages) still flow, so exits are not lost."""
        self._cut_off_until = trio.current_time() + seconds

    def partitioned(self) -> bool:
        return self._cut_off_until > -math.inf and trio.current_time() < self._cut_off_until

    def delay_to(self, addr: str) -> float:
        fault = self.links.get(addr)
        if fault is None:
            return 0.0
        if trio.current_time() >= fault[1]:
            del self.links[addr]
            return 0.0
        return fault[0]
