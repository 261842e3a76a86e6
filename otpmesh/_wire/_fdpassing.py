"""Descriptors passed on a Unix connection (``SCM_RIGHTS``): how the tensor channel hands a
reader its snapshot file without the reader touching the owner's process (which may not let it:
docs/security.md). ``PassesFds`` is that half of ``Connection``: what it sends with its next
bytes, what it received and keeps until taken, bounded."""

from __future__ import annotations

import array
import os
import socket
from typing import Any

import trio

#: Descriptors passed in one write, and kept received but not yet taken, per connection. Only a
#: tensor channel owner sends them, one per pin answered; a peer that sends more than a reader
#: takes cannot fill this process's descriptor table: the oldest are closed.
MAX_PASSED_FDS = 16
FD_SPACE = socket.CMSG_SPACE(MAX_PASSED_FDS * 4) if hasattr(socket, "CMSG_SPACE") else 0
FD_SPACE = socket.CMSG_SPACE(MAX_PASSED_FDS * 4) if hasattr(socket, "CMSG_SPACE") else 0


class PassesFds:
    """The descriptors a ``Connection`` passes and receives (its state is the connection's)."""

    sock: socket.socket
    peer: str
    closed: bool
    _unix: bool  # a Unix socket, where descriptors can travel
    _fds_out: list[int]  # our duplicates, sent with the next bytes written
    _fds_in: dict[tuple[int, int], int]  # (st_dev, st_ino) -> descriptor

    @property
    def passes_fds(self) -> bool:
        """Whether descriptors can travel on this connection (a Unix socket: the same host)."""
        return self._unix

    def pass_fd(self, fd: int) -> tuple[int, int]:
        """Send (a duplicate of) descriptor `fd` to the peer with the next bytes written on this
        connection, so it arrives no later than the next frame sent; return the key the peer
        takes it by (``take_fd``): the file's (st_dev, st_ino). Unix sockets only."""
        if not self._unix:
            raise ValueError(f"connection to {self.peer} cannot pass descriptors (not Unix)")
        if self.closed:  # nothing would send (or close) the duplicate
            raise trio.ClosedResourceError(f"connection to {self.peer} is closed")
        st = os.fstat(fd)
        self._fds_out.append(os.dup(fd))
        return st.st_dev, st.st_ino

    def take_fd(self, key: Any) -> int | None:
        """The descriptor the peer passed for file `key` (``pass_fd``'s answer there), now this
        caller's to close; None if none arrived (or it was closed, being too old)."""
        if type(key) is not list or len(key) != 2 or not all(type(k) is int for k in key):
            return None
        return self._fds_in.pop((key[0], key[1]), None)

    def _send(self, data: bytes | bytearray | memoryview) -> int:
        if not self._fds_out:
            return self.sock.send(data)
        fds = self._fds_out[:MAX_PASSED_FDS]
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sent = self.sock.sendmsg([data], rights)  # BlockingIOError: nothing went, fds stay
        del self._fds_out[: len(fds)]
        for fd in fds:  # the peer holds its own now
            os.close(fd)
        return sent

    def _keep_fd(self, fd: int) -> None:
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            return
        old = self._fds_in.pop((st.st_dev, st.st_ino), None)
        if old is not None:
            os.close(old)
        self._fds_in[st.st_dev, st.st_ino] = fd
        while len(self._fds_in) > MAX_PASSED_FDS:  # a peer passing what nobody takes
            os.close(self._fds_in.pop(next(iter(self._fds_in))))

    def _close_fds(self) -> None:
        for fd in [*self._fds_out, *self._fds_in.values()]:
            os.close(fd)
        self._fds_out.clear()
        self._fds_in.clear()
