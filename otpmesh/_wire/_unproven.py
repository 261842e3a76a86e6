"""A bound on the connections a listener holds for peers that have proved nothing yet.

Whatever such a connection is doing (sending nothing, half a handshake, half a request), it holds
a slot of its listener's ``Unproven`` until it proves itself (a node's secret, the tcp backend's
token) or is closed. At most ``PER_PEER`` slots per peer and ``PER_LISTENER`` per listener: a
newcomer past either bound evicts the oldest connection of its own peer, or else the oldest of
the peer holding the most. So a flood churns only itself: a newcomer is always let in, and a
peer that dials once (a worker dialing back) is evicted only when every slot is taken by peers
holding one each, i.e. by more than ``PER_LISTENER`` distinct peers at once. Processes a node knows
are its app's own (by pid, ``SO_PEERCRED``) take no slot at all.
"""

from __future__ import annotations

from types import TracebackType

import trio

#: Connections a listener holds at once for peers that have proved nothing yet.
PER_LISTENER = 64
#: Of those, at most this many for one peer (a host on TCP; a uid or pid on a Unix socket).
PER_PEER = 8


class Slot:
    """One connection's place in an ``Unproven``; ``with slot:`` runs the proof inside a cancel
    scope that an eviction cancels (then ``slot.evicted`` is True)."""

    def __init__(self, bound: Unproven, peer: str) -> None:
        self.peer = peer
        self.scope = trio.CancelScope()
        self._bound = bound

    def __enter__(self) -> Slot:
        self._bound._admit(self)
        self.scope.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._bound._release(self)
        return bool(self.scope.__exit__(exc_type, exc, tb))

    @property
    def evicted(self) -> bool:
        return self.scope.cancelled_caught


class Unproven:
    """The unproven connections of one listener, oldest first."""

    def __init__(self, *, per_listener: int = PER_LISTENER, per_peer: int = PER_PEER) -> None:
        self.per_listener = per_listener
        self.per_peer = per_peer
        self._slots: dict[Slot, None] = {}  # insertion order: oldest first
        self._by_peer: dict[str, int] = {}
        #: Connections evicted to make room for newer ones, since the listener started.
        self.evicted = 0

    def hold(self, peer: str) -> Slot:
        """A slot for a new connection from `peer`: ``with unproven.hold(peer) as slot:``."""
        return Slot(self, peer)

    def __len__(self) -> int:
        return len(self._slots)

    def holding(self, peer: str) -> int:
        """How many unproven connections `peer` holds now."""
        return self._by_peer.get(peer, 0)

    def _admit(self, slot: Slot) -> None:
        victim = None
        if self._by_peer.get(slot.peer, 0) >= self.per_peer:
            victim = next(s for s in self._slots if s.peer == slot.peer)
        elif len(self._slots) >= self.per_listener:
            most = max(self._by_peer.values())
            victim = next(s for s in self._slots if self._by_peer[s.peer] == most)
        if victim is not None:
            self._release(victim)
            victim.scope.cancel()
            self.evicted += 1
        self._slots[slot] = None
        self._by_peer[slot.peer] = self._by_peer.get(slot.peer, 0) + 1

    def _release(self, slot: Slot) -> None:
        if self._slots.pop(slot, 0) is None:
            left = self._by_peer[slot.peer] - 1
            if left:
                self._by_peer[slot.peer] = left
            else:
                del self._by_peer[slot.peer]


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` from the state (field 3) on, or None when it cannot be
    read (gone, no /proc, no descriptor left to open it with)."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'.
    return stat[stat.rfind(b")") + 2 :].split()


def parent_pid(pid: int) -> int | None:
    """The parent of process `pid` (from /proc), or None when it cannot be read."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None
