"""How a worker's calls into a process that died fail: with the words its controller uses.

A worker sees only the end of its connection to a peer that died. Its controller hears every
death of its workers first-hand, with the exit status (``_deaths.py``), and tells their peers
when its death lock says so (``peer_dying``, with how it died, before their sockets close). When
a connection ends before that word came, the worker asks its controller (``death_of``) before it
fails the calls still out on it: an actor calling another then reads "its process (pid N) killed
by signal 9 (SIGKILL)", as the controller's own calls do, not the end of a socket.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from .._node._node import Node
from .._wire._connection import Connection

#: How long a worker waits for its controller's answer (which itself waits up to a second for
#: the exit status, as the controller's own calls do) before it fails the calls with what the
#: connection says.
ASK_WAIT = 3.0


class PeerLoss:
    """A worker node's ``on_connection_lost``: fails a lost peer's calls as its controller
    would. `controller` gives the controller's connection now (a takeover replaces it)."""

    def __init__(self, node: Node, controller: Callable[[], Connection | None]) -> None:
        self._node = node
        self._controller = controller

    def __call__(self, conn: Connection) -> bool:
        """Take over failing `conn`'s calls (True) when there are some and only the controller
        can say why its process is gone."""
        controller = self._controller()
        if (
            not conn.pending
            or controller is None
            or controller.closed
            or conn is controller
            or self._node.dying.get(conn.peer) is not None  # told already
            or self._node.nursery is None
        ):
            return False
        self._node.nursery.start_soon(self._fail_as_told, conn, controller)
        return True

    async def _fail_as_told(self, conn: Connection, controller: Connection) -> None:
        answer = None
        with trio.move_on_after(ASK_WAIT):
            try:
                answer = await self._node.sys_call(controller, "death_of", conn.peer, "controller")
            except Exception:  # gone, or one that cannot say: the connection says what it can
                answer = None
        if isinstance(answer, str):  # and a later call into it is refused with these words
            self._node.peer_dying({"addr": conn.peer, "reason": answer})
        self._node.fail_pending(conn, self._node.lost_reason(conn))
