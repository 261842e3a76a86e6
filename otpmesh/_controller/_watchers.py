"""Whom the watch listener (``_watch.py``) serves, and how many: bounds that no one process of
the app's user can use up, and an accept loop that outlives a shortage of descriptors.

Any process of the app's user can connect to the listener, and can read its token file (the
directory keeps other users out, not the user's own processes). So, as on a node's listeners
(_wire/_unproven.py, _wire/_accepting.py): a connection that has not proved it holds the token
holds one of ``UNPROVEN`` slots, at most ``UNPROVEN_PER_PROCESS`` of them per process (the
kernel's word, ``SO_PEERCRED``), and a newcomer past either bound evicts the oldest of its own
process, or else of the process holding the most: a process that connects in a loop churns only
its own slots, and a watcher that dials once gets in. One that proved itself is served until it
leaves, never evicted: at most ``MAX_WATCHERS`` at once and ``WATCHERS_PER_PROCESS`` for one
process, so that one process cannot hold every place; one past either bound is told why and
closed. Accepting waits out EMFILE and the like (``Acceptor``) instead of ending the listener.
"""

from __future__ import annotations

import logging
import os

import trio

from .._wire._accepting import Acceptor
from .._wire._unproven import Unproven

#: Watchers served at once, and of those at most this many for one process.
MAX_WATCHERS = 8
WATCHERS_PER_PROCESS = 2
#: Connections still proving themselves, and of those at most this many for one process.
UNPROVEN = 16
UNPROVEN_PER_PROCESS = 2


class Watchers:
    """The listening trio socket `sock`'s accept loop and bounds (see the module's docstring):
    ``acceptor`` (its statistics: ``episodes``, ``failures``), ``unproven`` (``evicted``), and
    ``watching``, the watchers served now by process id."""

    def __init__(self, sock: trio.socket.SocketType, log: logging.Logger) -> None:
        self.acceptor = Acceptor(sock, log, f"otpmesh watch of pid {os.getpid()}")
        self.unproven = Unproven(per_listener=UNPROVEN, per_peer=UNPROVEN_PER_PROCESS)
        self.watching: dict[int, int] = {}
        #: Watchers that proved themselves but were turned away (a bound was reached).
        self.turned_away = 0

    def admit(self, pid: int) -> str | None:
        """Why process `pid`'s proven watcher may not be served (None: it may, and now is;
        ``leave`` when it is done)."""
        held = self.watching.get(pid, 0)
        served = sum(self.watching.values())
        why = None
        if held >= WATCHERS_PER_PROCESS:
            why = f"process {pid} watches this app {held} times already"
        elif served >= MAX_WATCHERS:
            why = f"{served} watchers watch this app already"
        if why is not None:
            self.turned_away += 1
            return (
                f"{why} (at most {MAX_WATCHERS}, {WATCHERS_PER_PROCESS} per process): stop "
                "one, then try again"
            )
        self.watching[pid] = held + 1
        return None

    def leave(self, pid: int) -> None:
        left = self.watching.pop(pid, 1) - 1
        if left:
            self.watching[pid] = left
