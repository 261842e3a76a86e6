"""Accepting connections when the process is short of descriptors or memory.

``accept()`` fails with EMFILE, ENFILE, ENOBUFS or ENOMEM when this process (or the host) has run
out of something a new connection needs. Nothing is wrong with the listener: the pending
connection waits in the kernel's backlog. So an accept loop must not end (a node's ending ends
its runtime, and with it every worker), nor spin, nor log every retry: ``Acceptor`` pauses,
doubling the pause up to ``MAX_PAUSE``, logs one warning when such an episode starts and one
line at INFO when it ends, and counts episodes for tests and statistics. A connection that
went away before it was taken (ECONNABORTED and the like) is skipped at once, as accept(2) asks.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

import trio

#: Why accept may fail for a while without anything being wrong with the listener.
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: Errors of one pending connection, not of the listener (accept(2) tells Linux programs to
#: retry on these at once; trio's SocketListener does the same).
CONNECTION_GONE = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNABORTED",
        "EPROTO",
        "ENETDOWN",
        "ENOPROTOOPT",
        "EHOSTDOWN",
        "ENONET",
        "EHOSTUNREACH",
        "EOPNOTSUPP",
        "ENETUNREACH",
        "EPERM",
    )
    if hasattr(errno, name)
)
#: The first pause after such a failure, and the longest (the pause doubles while it lasts).
FIRST_PAUSE = 0.05
MAX_PAUSE = 1.0


class Acceptor:
    """``await acceptor.accept()``: the next connection on the listening trio socket `sock`,
    waiting out shortages of descriptors or memory; other errors are raised. `what` names the
    listener in the log ("node pid 12 (\\0otpmesh/...)", "tcp backend 127.0.0.1:4000")."""

    def __init__(self, sock: trio.socket.SocketType, log: logging.Logger, what: str) -> None:
        self._sock = sock
        self._log = log
        self._what = what
        #: Shortages so far (each logged once), and failed accepts during them.
        self.episodes = 0
        self.failures = 0

    async def accept(self) -> tuple[trio.socket.SocketType, Any]:
        pause = 0.0
        while True:
            try:
                conn, address = await self._sock.accept()
            except OSError as exc:
                if exc.errno in CONNECTION_GONE:
                    continue  # that connection went away before we took it: the next one
                if exc.errno not in OUT_OF_RESOURCES:
                    raise
                self.failures += 1
                if not pause:
                    self.episodes += 1
                    self._log.warning(
                        "%s cannot accept connections now (%s): pausing until descriptors or "
                        "memory come back (logged once until it accepts again)",
                        self._what,
                        exc,
                    )
                pause = min(max(2 * pause, FIRST_PAUSE), MAX_PAUSE)
                await trio.sleep(pause)  # the connection waits in the kernel's backlog
                continue
            if pause:
                self._log.info("%s accepts connections again", self._what)
            return conn, address
