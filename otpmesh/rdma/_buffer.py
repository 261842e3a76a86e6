"""RDMABuffer: a registered region of an actor's memory, moved by handle.

The owner registers a contiguous tensor (or writable buffer); the small handle travels in
messages; any process holding it reads or writes the bytes one-sidedly through the best backend
both ends can use. Before a transfer the reader pins the buffer with its owner (so a ``drop`` or
the owner's garbage collector cannot free the memory mid-copy); pins die with the reader's
connection, so a SIGKILLed reader leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Iterable
from typing import Any

import trio

from .. import _codec
from .._errors import ActorDiedError, OtpmeshError
from .._hostid import boot_id, pid_namespace
from .._node import Node, current_node
from .._wire import Connection
from ._backend import Backend, Peer, Region
from ._registry import RDMAError, allowed_backends, registry

log = logging.getLogger("otpmesh.rdma")

# Fallbacks already said once: (best backend, backend used).
_warned: set[tuple[str, str]] = set()


# ---------------------------------------------------------------- memory


def _torch() -> Any:
    return sys.modules.get("torch")


def _describe_target(obj: Any) -> tuple[Region, str | None, list[int] | None]:
    """The memory of a tensor or writable buffer, with its dtype and shape (tensors only)."""
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise RDMAError(
                f"a {obj.device.type} tensor needs the cuda_ipc backend, which this "
                "build does not provide yet; move it to the CPU first"
            )
        if not obj.is_contiguous():
            raise RDMAError("RDMABuffer needs a contiguous tensor: call .contiguous() first")
        nbytes = obj.numel() * obj.element_size()
        return (
            Region(obj.data_ptr(), nbytes),
            str(obj.dtype).removeprefix("torch."),
            list(obj.shape),
        )
    try:
        view = memoryview(obj).cast("B")
    except TypeError:
        raise RDMAError(
            f"cannot register a {type(obj).__name__}: give a CPU tensor or a "
            "writable buffer (bytearray, numpy array, mmap)"
        ) from None
    if view.readonly:
        raise RDMAError(f"cannot register a read-only {type(obj).__name__}: it must be writable")
    address = ctypes.addressof(ctypes.c_char.from_buffer(view)) if len(view) else 0
    return Region(address, len(view)), None, None


# ---------------------------------------------------------------- the handle


class RDMABuffer:
    """A registered buffer of the calling actor's memory, or (when it arrived in a message) a
    handle to someone else's. ``await buf.read_into(t)``, ``await buf.write_from(t)``,
    ``buf.drop()``; ``buf.backend`` says what the last transfer used."""

    def __init__(self, data: Any) -> None:
        node = current_node()
        if node is None:
            raise RDMAError(
                "RDMABuffer needs a running otpmesh node: create it inside an actor, "
                "or in a controller after otpmesh.proc_mesh() or otpmesh.start()"
            )
        region, dtype, shape = _describe_target(data)
        buffer_id, entries = registry(node).register(data, region)
        self._handle: dict[str, Any] = {
            "id": buffer_id,
            "owner": node.addr,
            "pid": os.getpid(),
            "boot_id": boot_id(),
            "pidns": pid_namespace(),
            "nbytes": region.nbytes,
            "dtype": dtype,
            "shape": shape,
            "entries": entries,
        }
        self.backend: str | None = None

    @classmethod
    def _from_handle(cls, handle: dict[str, Any]) -> RDMABuffer:
        buf = cls.__new__(cls)
        buf._handle = handle
        buf.backend = None
        return buf

    @property
    def nbytes(self) -> int:
        return int(self._handle["nbytes"])

    @property
    def backends(self) -> list[str]:
        """The backends the owner offered for this buffer."""
        return list(self._handle["entries"])

    def __repr__(self) -> str:
        h = self._handle
        what = f"{h['dtype']}{h['shape']}" if h["dtype"] else f"{h['nbytes']} bytes"
        return f"RDMABuffer({what}, owner pid {h['pid']}, backends {self.backends})"

    async def read_into(self, dst: Any, *, timeout: float | None = None) -> Any:
        """Copy the buffer's bytes into `dst` (same size, dtype and shape); return `dst`."""
        await self._transfer(dst, "read", timeout)
        return dst

    async def write_from(self, src: Any, *, timeout: float | None = None) -> None:
        """Copy `src` (same size, dtype and shape) into the buffer."""
        await self._transfer(src, "write", timeout)

    def drop(self) -> None:
        """Release the buffer: it can no longer be read or written (pinned transfers finish)."""
        node = current_node()
        if node is None:
            return
        if self._handle["owner"] == node.addr:
            registry(node).drop(self._handle["id"])
            return
        conn = node._side.get(self._handle["owner"]) or node._conns.get(self._handle["owner"])
        if conn is not None:
            node.sys_cast(conn, "rdma", {"op": "drop", "buffer": self._handle["id"]})

    # ---------------------------------------------------------------- transfers

    def _check(self, local: Any) -> Region:
        region, dtype, shape = _describe_target(local)
        h = self._handle
        if (
            dtype is not None
            and h["dtype"] is not None
            and (dtype, shape) != (h["dtype"], h["shape"])
        ):
            raise RDMAError(
                f"buffer {h['id']} holds {h['dtype']}{h['shape']}, "
                f"the local tensor is {dtype}{shape}"
            )
        if region.nbytes != h["nbytes"]:
            raise RDMAError(
                f"buffer {h['id']} holds {h['nbytes']} bytes, the local one {region.nbytes}"
            )
        return region

    async def _transfer(self, local: Any, op: str, timeout: float | None) -> None:
        region = self._check(local)
        node = current_node()
        if node is None:
            raise RDMAError(
                "transfers need a running otpmesh node (inside an actor, or a "
                "controller after otpmesh.proc_mesh() or otpmesh.start())"
            )
        h = self._handle
        try:
            with trio.fail_after(timeout if timeout is not None else float("inf")):
                if h["owner"] == node.addr:
                    self._copy_locally(node, region, op)
                    return
                await self._transfer_remote(node, region, op)
        except trio.TooSlowError:
            raise RDMAError(
                f"{op} of buffer {h['id']} (owner pid {h['pid']}) timed out after {timeout:g} s"
            ) from None

    def _copy_locally(self, node: Node, region: Region, op: str) -> None:
        reg = registry(node).buffers.get(self._handle["id"])
        if reg is None or reg.dropped:
            raise RDMAError(f"buffer {self._handle['id']} was dropped")
        src, dst = (reg.region, region) if op == "read" else (region, reg.region)
        ctypes.memmove(dst.address, src.address, region.nbytes)
        self.backend = "local"

    async def _transfer_remote(self, node: Node, region: Region, op: str) -> None:
        h = self._handle
        try:
            conn = await node.connect_side(h["owner"])
        except OSError as exc:
            raise RDMAError(
                f"the owner of buffer {h['id']} (pid {h['pid']}) is gone: {exc}"
            ) from None
        name, backend = self._choose(node)

        async def request(backend_name: str, req: str, payload: Any) -> Any:
            return await node.sys_call(
                conn,
                "rdma",
                {"op": "backend", "backend": backend_name, "request": req, "payload": payload},
                f"buffer {h['id']}",
            )

        peer = Peer(h["pid"], h["boot_id"], h["pidns"], request)
        await self._owner_call(node, conn, "pin")
        try:
            entry = h["entries"][name]
            if op == "read":
                await backend.read(entry, peer, region, 0)
            else:
                await backend.write(entry, peer, region, 0)
        except (OSError, ConnectionError, RuntimeError, ValueError) as exc:
            # RuntimeError: the ibverbs backend's errors (remote access, peer lost, timeout).
            raise RDMAError(f"{op} of buffer {h['id']} over {name} failed: {exc}") from None
        finally:
            if not conn.closed:
                node.sys_cast(conn, "rdma", {"op": "unpin", "buffer": h["id"]})
        self.backend = name

    async def _owner_call(self, node: Node, conn: Connection, op: str) -> None:
        h = self._handle
        try:
            await node.sys_call(conn, "rdma", {"op": op, "buffer": h["id"]}, f"buffer {h['id']}")
        except ActorDiedError as exc:
            raise RDMAError(
                f"the owner of buffer {h['id']} (pid {h['pid']}) is gone: {exc.reason}"
            ) from None
        except OtpmeshError as exc:
            message = getattr(exc, "message", str(exc))
            raise RDMAError(message) from None

    def _choose(self, node: Node) -> tuple[str, Backend]:
        h = self._handle
        usable = registry(node).usable
        peer = Peer(h["pid"], h["boot_id"], h["pidns"], _no_request)
        allowed = allowed_backends()
        for name in allowed:
            backend = usable.get(name)
            entry = h["entries"].get(name)
            if backend is not None and entry is not None and backend.reaches(entry, peer):
                self._note_fallback([n for n in allowed if n in usable], name)
                return name, backend
        raise RDMAError(
            f"no backend reaches the owner of buffer {h['id']}: it offers "
            f"{sorted(h['entries'])}, this process can use {sorted(usable)} "
            f"(allowed: {allowed})"
        )

    @staticmethod
    def _note_fallback(allowed: Iterable[str], used: str) -> None:
        best = next(iter(allowed))
        if used != best and (best, used) not in _warned:
            _warned.add((best, used))
            log.warning(
                "tensor channel: using %s, not %s (not usable or not reaching the "
                "owner); said once",
                used,
                best,
            )


async def _no_request(backend: str, op: str, payload: Any) -> Any:
    raise RDMAError("no request channel here")


_codec.register_ext(
    RDMABuffer, _codec.EXT_RDMA_BUFFER, lambda b: b._handle, RDMABuffer._from_handle
)
