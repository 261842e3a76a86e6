"""A reader's connections to owners of the ``tcp`` backend that no transfer is using, kept open
for the next transfer (``IdleConnections``)."""

from __future__ import annotations

import socket
import threading

import trio

from .._wire._owntasks import spawn as spawn_own


class IdleConnections:
    """A reader's open connections to owners that no transfer is using (any thread), kept
    while the trio run that kept the first of them runs: a system task closes those left idle
    for a whole period (an owner that went away leaves no descriptor behind), and the
    rest when the run ends."""

    def __init__(self, period: float, keep: int) -> None:
        self.period = period  # seconds: one unused through a whole period is closed
        self.keep = keep  # per owner: more are closed when their transfer ends
        self._lock = threading.Lock()
        self._socks: dict[tuple[str, int], list[tuple[socket.socket, int]]] = {}
        self._period = 0  # sweeps so far: each kept connection notes the one it was kept in
        self.held = False

    def keep_for_this_run(self) -> None:
        if not self.held:
            self.held = True
            spawn_own(self._hold, name="otpmesh-rdma-tcp-idle")

    async def _hold(self) -> None:
        try:
            while True:
                await trio.sleep(self.period)
                self._sweep(everything=False)
        finally:
            self._sweep(everything=True)

    def _sweep(self, *, everything: bool) -> None:
        stale: list[socket.socket] = []
        with self._lock:
            self._period += 1
            for address, kept in list(self._socks.items()):
                fresh = [(s, p) for s, p in kept if not everything and p >= self._period - 1]
                stale += [s for s, p in kept if everything or p < self._period - 1]
                if fresh:
                    self._socks[address] = fresh
                else:
                    del self._socks[address]
            if everything:
                self.held = False
        for sock in stale:
            sock.close()

    def take(self, address: tuple[str, int]) -> socket.socket | None:
        with self._lock:
            socks = self._socks.get(address)
            return socks.pop()[0] if socks else None

    def give(self, address: tuple[str, int], sock: socket.socket) -> None:
        with self._lock:
            socks = self._socks.setdefault(address, [])
            if self.held and len(socks) < self.keep:
                socks.append((sock, self._period))
                return
        sock.close()

    def count(self) -> int:
        """How many connections are kept idle now."""
        with self._lock:
            return sum(len(kept) for kept in self._socks.values())
