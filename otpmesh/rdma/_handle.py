"""What a tensor-channel handle carries, what its owner vouches for, and the checks between them.

A handle is a capability: the owner's node address, a buffer id and an unguessable token, plus
the buffer's size, dtype and shape for the reader's own checks. It holds no pid and no memory
address, so nothing a sender writes into one can steer a reader's kernel copy. Before every
transfer the reader presents id and token to the owner (the pin it takes anyway), and the owner
answers with a ``Grant``: its pid, where the buffer lives, and each backend's entry. The reader
copies only what the grant says, after checking that the grant matches the handle and that the
process that answered is the pid the grant names.

Sans-IO: values in, values or ``RDMAError`` out.
"""

from __future__ import annotations

import re
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

from .._wire._arrays import shape_problem
from .._wire._peercred import peer_credentials
from ._error import RDMAError

TOKEN_BYTES = 16
_TOKEN = re.compile(f"[0-9a-f]{{{2 * TOKEN_BYTES}}}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
_MAX_ID = (1 << 63) - 1
_MAX_DIMS = 64
_FIELDS = ("id", "token", "owner", "nbytes", "dtype", "shape", "backends")
_GRANT_FIELDS = ("pid", "boot_id", "pidns", "nbytes", "dtype", "shape", "entries")


def new_token() -> str:
    return secrets.token_hex(TOKEN_BYTES)


def tokens_match(given: str, issued: str) -> bool:
    return secrets.compare_digest(given.encode(), issued.encode())


@dataclass(frozen=True, slots=True, kw_only=True)
class Handle:
    """An RDMABuffer as it travels: which buffer of which node, the token, and what it holds."""

    buffer: int
    token: str = field(repr=False)  # a capability: kept out of logs and tracebacks
    owner: str
    nbytes: int
    dtype: str | None
    shape: tuple[int, ...] | None
    backends: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.buffer,
            "token": self.token,
            "owner": self.owner,
            "nbytes": self.nbytes,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
            "backends": list(self.backends),
        }

    @classmethod
    def from_wire(cls, data: Any) -> Handle:
        """Validate every field's type and range; a malformed handle is an RDMAError here, never
        an object that fails later."""
        if not isinstance(data, dict):
            raise _malformed("the handle", data, f"a map with the fields {', '.join(_FIELDS)}")
        extra = sorted(str(k) for k in data if k not in _FIELDS)
        if extra:
            raise RDMAError(
                f"malformed RDMABuffer handle: unexpected field {extra[0]!r} (a handle holds "
                f"{', '.join(_FIELDS)}; it is made by RDMABuffer(tensor) in its owner)"
            )
        missing = [k for k in _FIELDS if k not in data]
        if missing:
            raise RDMAError(f"malformed RDMABuffer handle: field {missing[0]!r} is missing")
        buffer_id = _int(data, "id", low=1)
        token = data["token"]
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise _malformed("token", token, f"{2 * TOKEN_BYTES} lowercase hex digits")
        owner = data["owner"]
        if not isinstance(owner, str) or not 0 < len(owner) <= 256:
            raise _malformed("owner", owner, "a node address (a non-empty string)")
        dtype, shape = _dtype_and_shape(data, "RDMABuffer handle")
        names = data["backends"]
        if not isinstance(names, list) or not all(
            isinstance(n, str) and _NAME.fullmatch(n) for n in names
        ):
            raise _malformed("backends", names, "a list of backend names")
        return cls(
            buffer=buffer_id,
            token=token,
            owner=owner,
            nbytes=_int(data, "nbytes", low=0),
            dtype=dtype,
            shape=shape,
            backends=tuple(names),
        )

    def describe(self) -> str:
        return _describe(self.nbytes, self.dtype, self.shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """The owner's answer to a pin that presented the right token: where the buffer really is."""

    pid: int
    boot_id: str
    pidns: str
    nbytes: int
    dtype: str | None
    shape: tuple[int, ...] | None
    entries: dict[str, dict[str, Any]]

    def to_wire(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "boot_id": self.boot_id,
            "pidns": self.pidns,
            "nbytes": self.nbytes,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
            "entries": self.entries,
        }

    @classmethod
    def from_wire(cls, data: Any) -> Grant:
        if not isinstance(data, dict) or any(k not in data for k in _GRANT_FIELDS):
            raise RDMAError(f"the owner's answer to a pin is malformed: {str(data)[:120]!r}")
        boot, pidns, entries = data["boot_id"], data["pidns"], data["entries"]
        if not (
            isinstance(boot, str)
            and isinstance(pidns, str)
            and isinstance(entries, dict)
            and all(isinstance(k, str) and isinstance(v, dict) for k, v in entries.items())
        ):
            raise RDMAError(f"the owner's answer to a pin is malformed: {str(data)[:120]!r}")
        dtype, shape = _dtype_and_shape(data, "owner's answer")
        return cls(
            pid=_int(data, "pid", low=1, what="owner's answer"),
            boot_id=boot,
            pidns=pidns,
            nbytes=_int(data, "nbytes", low=0, what="owner's answer"),
            dtype=dtype,
            shape=shape,
            entries=entries,
        )


def check_grant(handle: Handle, grant: Grant, answered_by: int | None) -> None:
    """Refuse a grant that names a pid other than the process that sent it (`answered_by`, from
    SO_PEERCRED; None: not a Unix socket, where the connection's authentication is all there
    is), or that does not describe the buffer the handle describes."""
    if answered_by is not None and answered_by != grant.pid:
        raise RDMAError(
            f"buffer {handle.buffer}: its owner {handle.owner} answered that the buffer lives in "
            f"pid {grant.pid}, but that connection belongs to pid {answered_by}; refusing to "
            "read or write another process's memory (a forged handle or a lying owner)"
        )
    check_matches(handle, grant.nbytes, grant.dtype, grant.shape)


def check_matches(
    handle: Handle, nbytes: int, dtype: str | None, shape: tuple[int, ...] | None
) -> None:
    """Refuse a handle whose size, dtype or shape differ from what its owner registered: the
    reader sizes its copy by the handle, so an altered one would run past the buffer."""
    if (handle.nbytes, handle.dtype, handle.shape) != (nbytes, dtype, shape):
        raise RDMAError(
            f"buffer {handle.buffer}: the handle says it holds {handle.describe()}, its owner "
            f"registered {_describe(nbytes, dtype, shape)}; the handle was altered, nothing "
            "was read or written"
        )


def peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end of a Unix socket (the kernel's word), else None."""
    if sock.family != socket.AF_UNIX:
        return None
    return peer_credentials(sock)[0]


# ---------------------------------------------------------------- field checks


def _describe(nbytes: int, dtype: str | None, shape: tuple[int, ...] | None) -> str:
    return f"{dtype}{list(shape or [])} ({nbytes} bytes)" if dtype else f"{nbytes} bytes"


def _malformed(field: str, value: Any, expected: str, what: str = "RDMABuffer handle") -> RDMAError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return RDMAError(f"malformed {what}: field {field!r} is {shown}, expected {expected}")


def _int(data: dict[str, Any], field: str, low: int, what: str = "RDMABuffer handle") -> int:
    value = data[field]
    if type(value) is not int or not low <= value <= _MAX_ID:
        raise _malformed(field, value, f"an integer from {low} to 2**63-1", what)
    return value


def _dtype_and_shape(data: dict[str, Any], what: str) -> tuple[str | None, tuple[int, ...] | None]:
    dtype, shape = data["dtype"], data["shape"]
    if dtype is None and shape is None:
        return None, None
    if not isinstance(dtype, str) or not _NAME.fullmatch(dtype):
        raise _malformed("dtype", dtype, "a dtype name (or null, with a null shape)", what)
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_DIMS
        or not all(type(d) is int and 0 <= d <= _MAX_ID for d in shape)
    ):
        raise _malformed("shape", shape, "a list of sizes (non-negative integers)", what)
    problem = shape_problem(shape, "tensor")  # a zero-element one is bounded by no bytes
    if problem is not None:
        raise RDMAError(f"malformed {what}: {problem}")
    return dtype, tuple(shape)
