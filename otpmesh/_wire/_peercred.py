"""The kernel's word on the process at the other end of a Unix socket (``SO_PEERCRED``): who it
is, and whether it runs as this process's user (the peer cannot forge either)."""

from __future__ import annotations

import os
import socket
import struct

from .._core._errors import ProtocolError

_PEERCRED = struct.Struct("3i")  # pid, uid, gid


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (``SO_PEERCRED``: the
    kernel's word, which the peer cannot forge)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(creds)
    return int(pid), int(uid), int(gid)


def check_same_user(sock: socket.socket) -> None:
    """Raise ProtocolError unless the peer of Unix socket `sock` runs as this process's user."""
    uid = peer_credentials(sock)[1]
    if uid != os.getuid():
        raise ProtocolError(f"peer runs as uid {uid}, not this app's uid {os.getuid()}")
