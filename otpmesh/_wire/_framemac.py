"""Frame integrity for TCP: every frame after the handshake carries an HMAC-SHA256 tag over its
payload and its position in the stream, under a key only this connection's two ends know.

The keys come from the secret and both sides' nonces of the challenge-response (_secret.py), one
per direction, so a tag is valid on one connection, in one direction, at one position:

    key(d->a) = HMAC(secret, "otpmesh-frames-d2a" + nonce_a + nonce_d)
    key(a->d) = HMAC(secret, "otpmesh-frames-a2d" + nonce_a + nonce_d)
    frame     = length (u32) + payload + HMAC(key, sequence number (u64) + payload)

An attacker on the network path can read frames (they are not encrypted) but cannot change,
drop, reorder, replay or inject one without the receiver closing the connection. Sans-IO: the
connection calls ``seal`` for each frame it sends and ``open`` for each it receives.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from .._core._errors import ProtocolError

TAG_SIZE = 32
_SEQ = struct.Struct(">Q")
#: Frame integrity on TCP connections: "mac" (the default) or "none" (a network you trust).
ENV = "OTPMESH_TCP_INTEGRITY"


def wanted() -> bool:
    """Whether this process puts a MAC on its TCP frames (every host of a cluster must agree)."""
    value = os.environ.get(ENV, "mac")
    if value not in ("mac", "none"):
        raise ProtocolError(f"{ENV} must be 'mac' or 'none', not {value!r}")
    return value == "mac"


def session_keys(secret: bytes, nonce_a: bytes, nonce_d: bytes) -> tuple[bytes, bytes]:
    """(dialer->acceptor key, acceptor->dialer key) of one connection."""
    d2a = hmac.new(secret, b"otpmesh-frames-d2a" + nonce_a + nonce_d, hashlib.sha256).digest()
    a2d = hmac.new(secret, b"otpmesh-frames-a2d" + nonce_a + nonce_d, hashlib.sha256).digest()
    return d2a, a2d


class FrameMac:
    """The two directions' keys and sequence numbers of one connection."""

    def __init__(self, send_key: bytes, recv_key: bytes) -> None:
        self._send = hmac.new(send_key, digestmod=hashlib.sha256)
        self._recv = hmac.new(recv_key, digestmod=hashlib.sha256)
        self._sent = 0
        self._received = 0

    def seal(self, parts: tuple[bytes | bytearray | memoryview, ...]) -> bytes:
        """The tag to append to the frame whose payload is `parts` (the next one sent)."""
        mac = self._send.copy()
        mac.update(_SEQ.pack(self._sent))
        for part in parts:
            mac.update(part)
        self._sent += 1
        return mac.digest()

    def open(self, frame: bytes) -> bytes:
        """The payload of the next frame received, once its tag checks out."""
        if len(frame) < TAG_SIZE:
            raise ProtocolError(f"frame of {len(frame)} bytes is too short to carry its MAC")
        payload, tag = memoryview(frame)[:-TAG_SIZE], frame[-TAG_SIZE:]
        mac = self._recv.copy()
        mac.update(_SEQ.pack(self._received))
        mac.update(payload)
        if not hmac.compare_digest(mac.digest(), tag):
            raise ProtocolError(
                f"frame {self._received} failed its integrity check (changed, replayed or "
                "injected on the way): closing the connection"
            )
        self._received += 1
        return bytes(payload)
