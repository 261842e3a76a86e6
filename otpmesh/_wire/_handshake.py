"""Opening a connection: a versioned handshake, then a challenge-response proof of the secret,
before any frame (``dial`` on one side, ``accept`` on the other).

    dialer -> acceptor   MAGIC (8 bytes) + version (u16, big-endian) + flags (u16)
    acceptor -> dialer   the same, or the connection is closed
    both ways            challenge-response: both prove they know the secret (_secret.py)

On a Unix socket each side first checks that the peer runs as its own user (SO_PEERCRED,
_peercred.py). Then the socket carries frames (_framing.py) as a ``Connection``.
"""

from __future__ import annotations

import math
import random
import socket
import struct

import trio

from .._core._errors import ProtocolError
from . import _framemac, _secret
from ._addresses import tcp_address
from ._framemac import FrameMac
from ._peercred import check_same_user

MAGIC = b"OTPMESH\x00"
PROTOCOL_VERSION = 1
_HELLO = struct.Struct(">8sHH")
#: Handshake flag: this side puts a MAC on every frame (_framemac.py); both sides must agree.
FLAG_FRAME_MAC = 1
HANDSHAKE = _HELLO.pack(MAGIC, PROTOCOL_VERSION, 0)
#: How often ``dial`` tries when the listener closes the connection before the proof is done,
#: and its first pause between tries (doubled each time, with jitter).
DIAL_ATTEMPTS = 5
DIAL_PAUSE = 0.02


def check_handshake(data: bytes) -> int:
    """The peer's flags, or ProtocolError unless `data` is a handshake this version speaks."""
    magic, version, flags = _HELLO.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad handshake magic {magic!r}, expected {MAGIC!r}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"peer speaks protocol version {version}, this side {PROTOCOL_VERSION}")
    return int(flags)


async def recv_some(sock: socket.socket, n: int) -> bytes:
    """Receive up to `n` bytes from a non-blocking socket, waiting with trio when none are ready."""
    while True:
        try:
            return sock.recv(n)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)


async def send_all(sock: socket.socket, data: bytes | bytearray | memoryview) -> None:
    """Send all of `data` on a non-blocking socket, waiting with trio when its buffer is full."""
    view = memoryview(data).cast("B")
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)


class PeerClosed(ProtocolError):
    """Raised by ``dial`` and ``accept`` when the peer closed the connection before the proof
    was done (a listener evicting an unproven connection does that: ``dial`` tries again)."""


async def _receive_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = await recv_some(sock, n - len(data))
        if not chunk:
            raise PeerClosed(f"connection closed during handshake after {len(data)} bytes")
        data += chunk
    return bytes(data)


async def handshake(
    sock: socket.socket, *, dialer: bool, flags: int = 0, timeout: float = 10.0
) -> None:
    """Run the opening handshake on a fresh socket; raise ProtocolError if the peer is not ours
    or does not use the same `flags`."""
    ours = _HELLO.pack(MAGIC, PROTOCOL_VERSION, flags)
    with trio.fail_after(timeout):
        if dialer:
            await send_all(sock, ours)
            theirs = check_handshake(await _receive_exactly(sock, _HELLO.size))
        else:
            theirs = check_handshake(await _receive_exactly(sock, _HELLO.size))
            await send_all(sock, ours)
    if theirs != flags:

        def state(f: int) -> str:
            return "on" if f & FLAG_FRAME_MAC else "off"

        raise ProtocolError(
            f"the peer has frame MACs {state(theirs)}, this side {state(flags)}: set "
            f"{_framemac.ENV} the same on every host"
        )


def detach(stream: trio.SocketStream) -> socket.socket:
    """The non-blocking stdlib socket under a trio stream (connections drive sockets directly)."""
    sock = socket.socket(fileno=stream.socket.detach())
    sock.setblocking(False)
    return sock


async def dial(
    addr: str, secret: bytes | None, timeout: float = 10.0
) -> tuple[socket.socket, FrameMac | None]:
    """Connect to the node listening at `addr`, run the handshake, then prove that this side
    knows `secret` and check that the peer does, before any frame is sent. Returns the socket
    and, over TCP, the MAC its frames carry (give both to a ``Connection``).

    `addr` is an abstract Unix address (the peer must also run as this user), or
    ``tcp:HOST:PORT``. `secret` is the app's secret on Unix sockets, the cluster's on TCP.
    `timeout` bounds the handshake and the proof, each: the wait counts from the connect, so it
    includes the time the connection waits in the peer's listen backlog to be accepted.
    """
    if secret is None:
        raise ProtocolError(f"no otpmesh secret to authenticate with {addr}")
    for attempt in range(DIAL_ATTEMPTS):
        try:
            return await _dial_once(addr, secret, timeout)
        except (PeerClosed, ConnectionResetError, BrokenPipeError):
            # Evicted while proving itself (a listener's unproven slots are shared per host
            # and per process: a burst of this host's own dials, or a flood), or a wrong secret:
            # the listener closes both the same way. Dial again, a little later each time.
            if attempt == DIAL_ATTEMPTS - 1:
                raise
            await trio.sleep(DIAL_PAUSE * 2**attempt * (1 + random.random()))
    raise AssertionError("unreachable")


async def _dial_once(
    addr: str, secret: bytes, timeout: float
) -> tuple[socket.socket, FrameMac | None]:
    tcp = tcp_address(addr)
    if tcp is None:
        sock = detach(await trio.open_unix_socket(addr))
    else:
        sock = detach(await trio.open_tcp_stream(*tcp))
    try:
        if tcp is None:
            check_same_user(sock)
        with_mac = tcp is not None and _framemac.wanted()
        await handshake(sock, dialer=True, flags=FLAG_FRAME_MAC if with_mac else 0, timeout=timeout)
        keys = await authenticate(sock, secret, dialer=True, timeout=timeout)
    except BaseException:
        sock.close()
        raise
    return sock, FrameMac(*keys) if with_mac else None


async def accept(sock: socket.socket, secret: bytes, *, tcp: bool) -> FrameMac | None:
    """The acceptor's side of ``dial``: the peer of a fresh incoming connection proves it belongs
    to the app, or ProtocolError: the same user (Unix), the version handshake, then the secret's
    challenge-response. Fixed-size reads only, no frame before the proof (the caller bounds the
    time). Returns the MAC its frames carry over TCP."""
    if not tcp:
        check_same_user(sock)
    with_mac = tcp and _framemac.wanted()
    await handshake(sock, dialer=False, flags=FLAG_FRAME_MAC if with_mac else 0, timeout=math.inf)
    keys = await authenticate(sock, secret, dialer=False, timeout=math.inf)
    return FrameMac(*keys) if with_mac else None


async def authenticate(
    sock: socket.socket, secret: bytes, *, dialer: bool, timeout: float = 10.0
) -> tuple[bytes, bytes]:
    """Challenge-response after the handshake (see _secret.py); ProtocolError on failure.
    Returns this side's (send, receive) frame-MAC keys for the connection."""
    with trio.fail_after(timeout):
        if dialer:
            nonce_a = await _receive_exactly(sock, _secret.NONCE_SIZE)
            nonce_d = _secret.new_nonce()
            await send_all(sock, nonce_d + _secret.dialer_proof(secret, nonce_a, nonce_d))
            try:
                got = await _receive_exactly(sock, _secret.PROOF_SIZE)
            except ProtocolError:
                raise PeerClosed("the peer refused this node's secret") from None
            if not _secret.proof_ok(_secret.acceptor_proof(secret, nonce_a, nonce_d), got):
                raise ProtocolError("the peer does not know this app's secret")
            return _framemac.session_keys(secret, nonce_a, nonce_d)
        else:
            nonce_a = _secret.new_nonce()
            await send_all(sock, nonce_a)
            answer = await _receive_exactly(sock, _secret.NONCE_SIZE + _secret.PROOF_SIZE)
            nonce_d, got = answer[: _secret.NONCE_SIZE], answer[_secret.NONCE_SIZE :]
            if not _secret.proof_ok(_secret.dialer_proof(secret, nonce_a, nonce_d), got):
                raise ProtocolError("wrong secret: the dialer does not know this app's secret")
            await send_all(sock, _secret.acceptor_proof(secret, nonce_a, nonce_d))
            d2a, a2d = _framemac.session_keys(secret, nonce_a, nonce_d)
            return a2d, d2a
