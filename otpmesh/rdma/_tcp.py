"""The ``tcp`` backend: the last resort (other hosts, nothing better), on a connection of its own
per transfer, chunked, never through the control mailbox.

The owner listens on loopback (``OTPMESH_RDMA_TCP_HOST`` to bind elsewhere) and serves each
transfer in a thread straight from / into the tensor's memory; the owner's answer to a pin
carries a random per-buffer token that a request must present. A read-only buffer (a tensor sent
in a message) refuses writes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import socket
import struct
from typing import Any, ClassVar

import msgpack
import trio

from ._backend import Peer, Region

_LEN = struct.Struct(">I")
_CHUNK = 4 << 20
_OK, _FAIL = b"\x00", b"\x01"
#: What a write to a read-only buffer is told (the registry says the same at the pin).
READ_ONLY = (
    "buffer {} is read-only: it holds a value sent in a message (a snapshot other receivers "
    "read too); write to an RDMABuffer its owner registered instead"
)


def _view(region: Region, offset: int, nbytes: int) -> memoryview:
    raw = (ctypes.c_char * nbytes).from_address(region.address + offset)
    return memoryview(raw).cast("B")


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the connection closed mid-transfer")
        data += chunk
    return bytes(data)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    done = 0
    while done < len(view):
        got = sock.recv_into(view[done : done + _CHUNK])
        if not got:
            raise ConnectionError("the connection closed mid-transfer")
        done += got


def _send_view(sock: socket.socket, view: memoryview) -> None:
    for start in range(0, len(view), _CHUNK):
        sock.sendall(view[start : start + _CHUNK])


class TcpBackend:
    name: ClassVar[str] = "tcp"

    def __init__(self) -> None:
        self._buffers: dict[int, tuple[Region, str, bool]] = {}  # region, token, writable
        self._address: tuple[str, int] | None = None
        self._listener: socket.socket | None = None

    def unavailable(self) -> str | None:
        return None

    # ---------------------------------------------------------------- owner

    def register(self, buffer_id: int, region: Region, *, writable: bool) -> dict[str, Any]:
        host, port = self._listen()
        token = secrets.token_hex(16)
        self._buffers[buffer_id] = (region, token, writable)
        return {"host": host, "port": port, "token": token, "buffer": buffer_id}

    def unregister(self, buffer_id: int) -> None:
        self._buffers.pop(buffer_id, None)

    def _listen(self) -> tuple[str, int]:
        if self._address is None:
            host = os.environ.get("OTPMESH_RDMA_TCP_HOST", "127.0.0.1")
            listener = socket.create_server((host, 0))
            self._listener = listener
            self._address = (host, listener.getsockname()[1])
            trio.lowlevel.spawn_system_task(self._accept_loop, listener, name="otpmesh-rdma-tcp")
        return self._address

    async def _accept_loop(self, listener: socket.socket) -> None:
        # A system task: it must never raise (that would end the whole trio run).
        try:
            sock = trio.socket.from_stdlib_socket(listener)
            async with trio.open_nursery() as nursery:
                while True:
                    conn, _ = await sock.accept()
                    raw = socket.socket(fileno=conn.detach())
                    raw.setblocking(True)
                    nursery.start_soon(trio.to_thread.run_sync, self._serve_blocking, raw)
        except Exception:
            logging.getLogger("otpmesh.rdma").exception("the tcp backend stopped serving")
        finally:
            listener.close()

    def _serve_blocking(self, sock: socket.socket) -> None:
        with sock:
            try:
                (size,) = _LEN.unpack(_recv_exactly(sock, 4))
                req = msgpack.unpackb(_recv_exactly(sock, size))
                found = self._buffers.get(req["buffer"])
                if found is None or not secrets.compare_digest(found[1], req["token"]):
                    sock.sendall(_FAIL + b"buffer not registered (dropped?)")
                    return
                region, _, writable = found
                if req["op"] != "read" and not writable:
                    sock.sendall(_FAIL + READ_ONLY.format(req["buffer"]).encode())
                    return
                if req["offset"] + req["nbytes"] > region.nbytes:
                    sock.sendall(_FAIL + b"transfer runs past the end of the buffer")
                    return
                view = _view(region, req["offset"], req["nbytes"])
                sock.sendall(_OK)
                if req["op"] == "read":
                    _send_view(sock, view)
                else:
                    _recv_into(sock, view)
                    sock.sendall(_OK)
            except (OSError, ConnectionError, ValueError, KeyError):
                return  # the reader went away: nothing to clean up but this socket

    # ---------------------------------------------------------------- reader

    def reaches(self, entry: dict[str, Any], peer: Peer) -> bool:
        return True

    async def read(self, entry: dict[str, Any], peer: Peer, dst: Region, offset: int) -> None:
        await trio.to_thread.run_sync(self._transfer, entry, "read", dst, offset)

    async def write(self, entry: dict[str, Any], peer: Peer, src: Region, offset: int) -> None:
        await trio.to_thread.run_sync(self._transfer, entry, "write", src, offset)

    @staticmethod
    def _transfer(entry: dict[str, Any], op: str, local: Region, offset: int) -> None:
        with socket.create_connection((entry["host"], entry["port"]), timeout=30) as sock:
            request = msgpack.packb(
                {
                    "buffer": entry["buffer"],
                    "token": entry["token"],
                    "op": op,
                    "offset": offset,
                    "nbytes": local.nbytes,
                }
            )
            sock.sendall(_LEN.pack(len(request)) + request)
            status = _recv_exactly(sock, 1)
            if status != _OK:
                raise ConnectionError(sock.recv(4096).decode(errors="replace"))
            view = _view(local, 0, local.nbytes)
            if op == "read":
                _recv_into(sock, view)
            else:
                _send_view(sock, view)
                if _recv_exactly(sock, 1) != _OK:
                    raise ConnectionError("the owner did not confirm the write")

    async def serve(self, op: str, payload: Any) -> Any:
        raise ValueError(f"the tcp backend has no request {op!r}")
