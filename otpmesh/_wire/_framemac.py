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


#: Frames up to this size are tagged in one call (one copy, C all the way); bigger ones are fed to
#: the MAC piece by piece, without joining them.
_ONE_SHOT = 1 << 16


class FrameMac:
    """The two directions' keys and sequence numbers of one connection."""

    def __init__(self, send_key: bytes, recv_key: bytes) -> None:
        self._send_key = send_key
        self._recv_key = recv_key
        self._sent = 0
        self._received = 0

    def seal(self, parts: tuple[bytes | bytearray | memoryview, ...]) -> bytes:
        """The tag to append to the frame whose payload is `parts` (the next one sent)."""
        seq = _SEQ.pack(self._sent)
        self._sent += 1
        if sum(len(part) for part in parts) <= _ONE_SHOT:
            return hmac.digest(self._send_key, b"".join((seq, *parts)), "sha256")
        mac = hmac.new(self._send_key, seq, hashlib.sha256)
        for part in parts:
            mac.update(part)
        return mac.digest()

    def open(self, frame: bytes) -> bytes:
        """The payload of the next frame received, once its tag checks out."""
        if len(frame) < TAG_SIZE:
            raise ProtocolError(f"frame of {len(frame)} bytes is too short to carry its MAC")
        payload, tag = frame[:-TAG_SIZE], frame[-TAG_SIZE:]
        seq = _SEQ.pack(self._received)
        if len(payload) <= _ONE_SHOT:
            expected = hmac.digest(self._recv_key, seq + payload, "sha256")
        else:
            mac = hmac.new(self._recv_key, seq, hashlib.sha256)
            mac.update(payload)
            expected = mac.digest()
        if not hmac.compare_digest(expected, tag):
            raise ProtocolError(
                f"frame {self._received} failed its integrity check (changed, replayed or "
                "injected on the way): closing the connection"
            )
        self._received += 1
        return payload
