"""The app's secret as the takeover journal keeps it: wrapped under the user's key, never in
the clear.

A standby needs the running app's secret (its workers and fork server accept nothing else), and
it reads everything else from the journal. Kept there in the clear, the secret was anyone's who
could read the state directory (a same-user process told only the directory joined the app).
So the journal holds it wrapped under a key that is not in the directory: by default the user's
otpmesh secret (``OTPMESH_SECRET``, ``OTPMESH_SECRET_FILE`` or ``~/.otpmesh/secret``, as for
clusters; Erlang's cookie), or the bytes given as ``Takeover(key=...)``:

    salt     32 random bytes, new for every record
    wrapped  secret XOR HMAC-SHA256(key, "otpmesh-app-wrap" + salt + counter) blocks
    tag      HMAC-SHA256(key, "otpmesh-app-tag" + salt + wrapped)

HMAC is a pseudo-random function, and a salt is never used twice, so the pad is never reused;
the tag tells a wrong key (a standby started with another) from a damaged record, and says so.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

from .._core._errors import TakeoverError
from .._wire._secret import SecretError, load_secret

_BLOCK = hashlib.sha256().digest_size


def takeover_key(given: bytes | None) -> bytes:
    """The key the app's secret is wrapped under: `given`, or the user's otpmesh secret (made
    if missing, as a cluster's is)."""
    if given is not None:
        return given
    try:
        return load_secret(create=True)
    except (SecretError, OSError) as exc:
        raise TakeoverError(
            f"takeover: no key to keep the app's secret under ({exc}); set OTPMESH_SECRET or "
            "OTPMESH_SECRET_FILE, or pass Takeover(..., key=...)"
        ) from None


def wrap(key: bytes, secret: bytes) -> dict[str, str]:
    """The journal's fields for `secret` under `key` (hex)."""
    salt = secrets.token_bytes(32)
    wrapped = _xor(secret, _pad(key, salt, len(secret)))
    return {"salt": salt.hex(), "wrapped": wrapped.hex(), "tag": _tag(key, salt, wrapped).hex()}


def unwrap(key: bytes, record: dict[str, Any]) -> bytes:
    """The secret `record` (an app record) holds under `key`; TakeoverError if it holds none or
    was kept under another key."""
    try:
        salt, wrapped, tag = (bytes.fromhex(str(record[name])) for name in _FIELDS)
    except (KeyError, ValueError):
        raise TakeoverError(
            "takeover: the journal's app record holds no wrapped secret (written by another "
            "version of otpmesh?): cannot take that run over"
        ) from None
    if not hmac.compare_digest(tag, _tag(key, salt, wrapped)):
        raise TakeoverError(
            "takeover: the run in the journal kept its secret under another key: start the "
            "standby with the active controller's key (the same OTPMESH_SECRET, "
            "OTPMESH_SECRET_FILE or ~/.otpmesh/secret, or the same Takeover(key=...))"
        )
    return _xor(wrapped, _pad(key, salt, len(wrapped)))


_FIELDS = ("salt", "wrapped", "tag")


def _pad(key: bytes, salt: bytes, size: int) -> bytes:
    blocks = (size + _BLOCK - 1) // _BLOCK
    return b"".join(
        hmac.new(key, b"otpmesh-app-wrap" + salt + i.to_bytes(4, "big"), hashlib.sha256).digest()
        for i in range(blocks)
    )[:size]


def _tag(key: bytes, salt: bytes, wrapped: bytes) -> bytes:
    return hmac.new(key, b"otpmesh-app-tag" + salt + wrapped, hashlib.sha256).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))
