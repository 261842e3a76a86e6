"""Refused peers, logged once per peer and then rate-limited: a flood of bad connections must
not flood the log (nor hide the first, which says why)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

from ._peercred import peer_credentials

#: After a peer's first refusal, at most one summary line per peer per this many seconds.
SUMMARY_EVERY = 60.0
#: Peers remembered; beyond it the oldest is forgotten (an attacker controls peer names).
MAX_PEERS = 1024


def describe_peer(sock: socket.socket, tcp: bool) -> str:
    """Who is at the other end: 'HOST:PORT' over TCP, 'pid P (uid U)' on a Unix socket."""
    if tcp:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    pid, uid, _gid = peer_credentials(sock)
    return f"pid {pid} (uid {uid})"


class RefusalLog:
    """Logs a refused peer with its reason: the first time at WARNING, later ones folded into
    one line per peer per SUMMARY_EVERY seconds (and each at DEBUG). ``counts`` has every
    refusal, by peer."""

    def __init__(self, log: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}  # peer key -> (last logged, unlogged)
        self.counts: dict[str, int] = {}

    def refused(self, peer: str, why: str) -> None:
        key = _key(peer)
        self.counts[key] = self.counts.get(key, 0) + 1
        if len(self.counts) > MAX_PEERS:
            del self.counts[next(iter(self.counts))]
        now = self._clock()
        last = self._seen.get(key)
        if last is None:
            self._remember(key, (now, 0))
            self._log.warning("refused %s: %s", peer, why)
        elif now - last[0] >= SUMMARY_EVERY:
            self._remember(key, (now, 0))
            self._log.warning(
                "refused %s: %s (and %d more refusals since %.0f s ago)",
                peer,
                why,
                last[1],
                now - last[0],
            )
        else:
            self._seen[key] = (last[0], last[1] + 1)
            self._log.debug("refused %s: %s", peer, why)  # each one, for who asks for DEBUG

    def _remember(self, key: str, entry: tuple[float, int]) -> None:
        self._seen.pop(key, None)
        self._seen[key] = entry
        if len(self._seen) > MAX_PEERS:
            del self._seen[next(iter(self._seen))]


def _key(peer: str) -> str:
    """The part of a peer's name that stays the same across its connections: the host of
    'HOST:PORT', the uid of 'pid P (uid U)'."""
    if peer.startswith("pid ") and "(uid " in peer:
        return "uid " + peer.rsplit("(uid ", 1)[1].rstrip(")")
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer
