"""The secrets, and the challenge-response every connection opens with.

Like Erlang's cookie: every node of one application shares a secret; it never crosses the wire.
On one host it is the app's own (made when the controller starts); over TCP it is the cluster's
(``OTPMESH_SECRET``, a file, see ``load_secret``). After the version handshake both sides prove
they know it:

    acceptor -> dialer    nonce_a                                   (32 random bytes)
    dialer -> acceptor    nonce_d + HMAC(secret, "dialer" + nonce_a + nonce_d)
    acceptor -> dialer    HMAC(secret, "acceptor" + nonce_d + nonce_a)

A peer without the secret gets nothing but the handshake and the acceptor's nonce, and the
attempt is logged.
The proofs are pure functions here; ``_wire.authenticate`` does the I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

NONCE_SIZE = 32
PROOF_SIZE = 32
#: Where the secret lives when neither OTPMESH_SECRET nor OTPMESH_SECRET_FILE says otherwise.
DEFAULT_SECRET_FILE = Path("~/.otpmesh/secret")


class SecretError(Exception):
    """The secret could not be found or read."""


def new_app_secret() -> bytes:
    """A fresh per-app secret (a controller makes one at start; its workers get it at fork
    time, over the fork server's private socket pair, never on argv or in the environment)."""
    return secrets.token_bytes(32)


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_SIZE)


def dialer_proof(secret: bytes, nonce_a: bytes, nonce_d: bytes) -> bytes:
    return hmac.new(secret, b"otpmesh-dialer" + nonce_a + nonce_d, hashlib.sha256).digest()


def acceptor_proof(secret: bytes, nonce_a: bytes, nonce_d: bytes) -> bytes:
    return hmac.new(secret, b"otpmesh-acceptor" + nonce_d + nonce_a, hashlib.sha256).digest()


def proof_ok(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


def load_secret(*, create: bool = False) -> bytes:
    """The secret: ``OTPMESH_SECRET``, else the file ``OTPMESH_SECRET_FILE``, else
    ``~/.otpmesh/secret``; with `create`, a missing default file is made (mode 0600)."""
    value = os.environ.get("OTPMESH_SECRET")
    if value:
        return value.encode()
    named = os.environ.get("OTPMESH_SECRET_FILE")
    path = Path(named) if named else DEFAULT_SECRET_FILE.expanduser()
    try:
        return read_secret_file(path)
    except FileNotFoundError:
        if named or not create:
            raise SecretError(
                f"no otpmesh secret: set OTPMESH_SECRET, or put one in {path} (mode 0600)"
            ) from None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Written whole under a name of its own, then linked in: processes that make it at once
    # (a job's controller and its standby, test workers) all read the one that got there
    # first, never a half-written one.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
    return read_secret_file(path)


def read_secret_file(path: Path) -> bytes:
    """The secret in `path` (surrounding whitespace stripped); refuse a file others can read."""
    mode = path.stat().st_mode
    if mode & 0o077:
        raise SecretError(f"{path} is readable by others (mode {mode & 0o777:o}); chmod 600 it")
    value = path.read_bytes().strip()
    if not value:
        raise SecretError(f"{path} is empty")
    return value
