"""The ``tcp`` backend's requests on the wire: their framing (``Request``, at most
``REQUEST_MAX`` bytes), the owner's answer (``OK``, or ``FAIL`` and its reason), and the socket
loops that move a region's bytes in ``CHUNK``s."""

from __future__ import annotations

import ctypes
import socket
import struct
from dataclasses import dataclass

import msgpack
import trio

from ._backend import Region
from ._handle import tokens_match

LEN = struct.Struct(">I")
CHUNK = 4 << 20
OK, FAIL = b"\x00", b"\x01"
OPS = ("read", "write")
#: The longest request a reader of ours sends (its msgpack header), with room to spare.
REQUEST_MAX = 1024
#: What a write to a read-only buffer is told (the registry says the same at the pin).
READ_ONLY = (
    "buffer {} is read-only: it holds a value sent in a message (a snapshot other receivers "
    "read too); write to an RDMABuffer its owner registered instead"
)


def view_of(region: Region, offset: int, nbytes: int) -> memoryview:
    raw = (ctypes.c_char * nbytes).from_address(region.address + offset)
    return memoryview(raw).cast("B")


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the connection closed mid-transfer")
        data += chunk
    return bytes(data)


def recv_into(sock: socket.socket, view: memoryview) -> None:
    done = 0
    while done < len(view):
        got = sock.recv_into(view[done : done + CHUNK])
        if not got:
            raise ConnectionError("the connection closed mid-transfer")
        done += got


async def receive(sock: socket.socket, n: int) -> bytes:
    """`n` bytes from the non-blocking `sock`, waiting for them in trio (no thread)."""
    data = bytearray()
    while len(data) < n:
        await trio.lowlevel.wait_readable(sock)
        try:
            chunk = sock.recv(n - len(data))
        except BlockingIOError:
            continue
        if not chunk:
            raise ConnectionError("the connection closed mid-request")
        data += chunk
    return bytes(data)


def send_view(sock: socket.socket, view: memoryview) -> None:
    for start in range(0, len(view), CHUNK):
        sock.sendall(view[start : start + CHUNK])


@dataclass(frozen=True, slots=True)
class Request:
    """One transfer a reader asks for, as the owner received it (anyone may have sent it)."""

    buffer: int
    token: str
    op: str
    offset: int
    nbytes: int

    def pack(self) -> bytes:
        fields = {name: getattr(self, name) for name in self.__slots__}
        body: bytes = msgpack.packb(fields)
        return LEN.pack(len(body)) + body

    @classmethod
    def parse(cls, body: bytes) -> Request:
        """ValueError unless `body` is a request of ours, with in-range numbers."""
        req = msgpack.unpackb(body)
        if not isinstance(req, dict) or set(req) != set(cls.__slots__):
            raise ValueError("not a transfer request")
        buffer, token, op, offset, nbytes = (req[name] for name in cls.__slots__)
        numbers = (buffer, offset, nbytes)
        if not all(type(n) is int and n >= 0 for n in numbers) or not isinstance(token, str):
            raise ValueError("a transfer request with fields of the wrong type or sign")
        if not token.isascii():  # ours are hex; compare_digest refuses other str
            raise ValueError("a transfer request whose token is not ASCII")
        if op not in OPS:
            raise ValueError(f"a transfer request for {op!r}, not one of {OPS}")
        return cls(buffer=buffer, token=token, op=op, offset=offset, nbytes=nbytes)


def ask(sock: socket.socket, request: Request) -> str | None:
    """Send `request`; None when the owner accepted it, else the owner's reason (and it closes
    the connection). OSError when the connection is broken."""
    sock.sendall(request.pack())
    if recv_exactly(sock, 1) == OK:
        return None
    return sock.recv(4096).decode(errors="replace")


def why_refused(req: Request, found: tuple[Region, str, bool] | None) -> str | None:
    """Why the owner refuses `req` for the buffer it `found` under that id, or None."""
    if found is None or not tokens_match(req.token, found[1]):
        return "buffer not registered (dropped?)"
    region, _, writable = found
    if req.op != "read" and not writable:
        return READ_ONLY.format(req.buffer)
    if req.offset + req.nbytes > region.nbytes:
        return "transfer runs past the end of the buffer"
    return None


class Refused(ConnectionError):
    """Raised by a reader's transfer when the owner refused the request (and said why)."""


def granted(sock: socket.socket, refusal: str | None) -> socket.socket:
    if refusal is not None:
        sock.close()
        raise Refused(refusal)
    return sock
