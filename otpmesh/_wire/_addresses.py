"""Node addresses, and the listening sockets behind them.

\0otpmesh/<pid>/<role>/<random>   an abstract Unix socket: one host, nothing on disk
tcp:HOST:PORT                     TCP, across hosts (authenticated, see _secret.py)
"""

from __future__ import annotations

import os
import socket
import uuid


def new_address(role: str) -> str:
    """A fresh abstract Unix socket address: nothing on disk to leak if the process is killed."""
    return f"\0otpmesh/{os.getpid()}/{role}/{uuid.uuid4().hex[:12]}"


def tcp_address(addr: str) -> tuple[str, int] | None:
    """(host, port) of a ``tcp:HOST:PORT`` address; None for a Unix address."""
    if not addr.startswith("tcp:"):
        return None
    host, _, port = addr[4:].rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad TCP address {addr!r}: expected tcp:HOST:PORT")
    return host.strip("[]"), int(port)


#: Connections a Unix listener holds waiting to be accepted (the kernel caps it at somaxconn).
UNIX_BACKLOG = 4096


def bind(role: str, listen: str | None) -> socket.socket:
    """A listening socket: a fresh abstract Unix one, or TCP on ``tcp:HOST[:PORT]``."""
    # Bound at once, not in a thread: an abstract address never touches the filesystem (and a
    # thread would confuse MockClock's autojump in tests).
    if listen is None:
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.bind(new_address(role))
        # Room for a thousand workers dialing their controller at once: past the backlog a
        # Unix connect fails (EAGAIN) rather than waiting its turn (seen: 22 of 1,000 refused
        # while a slowed controller worked through 128). Strangers are bounded after accept.
        raw.listen(UNIX_BACKLOG)
        return raw
    if not listen.startswith("tcp:"):
        raise ValueError(f"listen must be tcp:HOST or tcp:HOST:PORT, not {listen!r}")
    host, _, port = listen[4:].partition(":")
    return bind_tcp(host, int(port or 0))


def bind_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    raw = socket.create_server((host, port), family=family)
    raw.listen(128)
    return raw


def listen_address(raw: socket.socket) -> str:
    """The address peers dial to reach the listening socket `raw`."""
    if raw.family == socket.AF_UNIX:
        name = raw.getsockname()
        return name.decode() if isinstance(name, bytes) else str(name)
    host, port = raw.getsockname()[:2]
    return f"tcp:[{host}]:{port}" if ":" in host else f"tcp:{host}:{port}"
