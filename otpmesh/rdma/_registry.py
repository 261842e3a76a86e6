"""One node's tensor-channel state: the backends this process can use, the buffers it owns, and
the pins readers hold on them (tied to their connections, so a dead reader leaves none)."""

from __future__ import annotations

import importlib
import itertools
import os
from dataclasses import dataclass, field
from typing import Any

import trio

from .._errors import OtpmeshError
from .._node import Node, current_node
from .._wire import Connection
from ._backend import Backend, Region
from ._shm import ShmBackend
from ._tcp import TcpBackend

#: Preference order: the first backend both ends can use wins.
PREFERENCE = ("cuda_ipc", "shm", "ibverbs", "tcp")


class RDMAError(OtpmeshError):
    """Raised by RDMABuffer transfers: size/dtype/shape mismatch, dropped buffer, dead owner,
    timeout, or no backend that reaches the owner."""


def allowed_backends() -> list[str]:
    """The backends this process may use, in preference order (OTPMESH_RDMA_BACKENDS)."""
    configured = os.environ.get("OTPMESH_RDMA_BACKENDS")
    if not configured:
        return list(PREFERENCE)
    names = [n.strip() for n in configured.split(",") if n.strip()]
    unknown = [n for n in names if n not in PREFERENCE]
    if unknown:
        raise RDMAError(
            f"OTPMESH_RDMA_BACKENDS names unknown backends {unknown}; "
            f"known: {', '.join(PREFERENCE)}"
        )
    return names


def _make_backends() -> dict[str, Backend]:
    made: dict[str, Backend] = {"shm": ShmBackend(), "tcp": TcpBackend()}
    try:  # imported by name: the ibverbs backend is optional (pyverbs, a device)
        ibverbs = importlib.import_module("otpmesh.rdma._ibverbs")
    except ImportError:
        pass
    else:
        made["ibverbs"] = ibverbs.IbverbsBackend()
    return made


@dataclass
class _Registered:
    obj: Any  # keeps the memory alive while registered or pinned
    region: Region
    pins: dict[int, int] = field(default_factory=dict)  # id(conn) -> count
    dropped: bool = False


class Registry:
    """One node's tensor-channel state: its backends, and the buffers it owns."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.backends = _make_backends()
        self.usable = {n: b for n, b in self.backends.items() if b.unavailable() is None}
        self.buffers: dict[int, _Registered] = {}
        self._ids = itertools.count(1)
        self._expiring: dict[int, float] = {}
        node.sys_handlers["rdma"] = self._serve
        node.close_hooks.append(self._release_pins)

    def register(self, obj: Any, region: Region) -> tuple[int, dict[str, Any]]:
        buffer_id = next(self._ids)
        self.buffers[buffer_id] = _Registered(obj, region)
        entries = {
            n: b.register(buffer_id, region)
            for n, b in self.usable.items()
            if n in allowed_backends()
        }
        return buffer_id, entries

    def expire(self, buffer_id: int, deadline: float) -> None:
        """Drop a temporary buffer at `deadline` if nobody fetched it (its reader died)."""
        self._expiring[buffer_id] = deadline
        now = trio.current_time()
        for old, when in list(self._expiring.items()):
            if when <= now:
                del self._expiring[old]
                self.drop(old)

    def drop(self, buffer_id: int) -> None:
        self._expiring.pop(buffer_id, None)
        reg = self.buffers.get(buffer_id)
        if reg is None or reg.dropped:
            return
        reg.dropped = True
        if not reg.pins:
            self._forget(buffer_id)

    def _forget(self, buffer_id: int) -> None:
        self.buffers.pop(buffer_id, None)
        for backend in self.usable.values():
            backend.unregister(buffer_id)

    def _release_pins(self, conn: Connection) -> None:
        for buffer_id, reg in list(self.buffers.items()):
            if reg.pins.pop(id(conn), None) is not None and reg.dropped and not reg.pins:
                self._forget(buffer_id)

    async def _serve(self, conn: Connection | None, p: dict[str, Any]) -> Any:
        op, buffer_id = p["op"], p.get("buffer")
        if op == "backend":
            return await self.usable[p["backend"]].serve(p["request"], p["payload"])
        reg = self.buffers.get(buffer_id) if buffer_id is not None else None
        key = id(conn)
        if op == "pin":
            if reg is None or reg.dropped:
                raise RDMAError(f"buffer {buffer_id} was dropped by its owner")
            reg.pins[key] = reg.pins.get(key, 0) + 1
            return True
        if op == "unpin" and reg is not None:
            left = reg.pins.get(key, 0) - 1
            if left > 0:
                reg.pins[key] = left
            else:
                reg.pins.pop(key, None)
            if reg.dropped and not reg.pins:
                self._forget(buffer_id)  # type: ignore[arg-type]
            return True
        if op == "drop":
            self.drop(buffer_id)  # type: ignore[arg-type]
            return True
        raise RDMAError(f"unknown tensor-channel request {op!r}")


def registry(node: Node) -> Registry:
    if node.rdma is None:
        node.rdma = Registry(node)
    reg: Registry = node.rdma
    return reg


def backends() -> list[str]:
    """The backends this process can use now, in preference order."""
    node = current_node()
    usable = (
        registry(node).usable
        if node is not None
        else {n: b for n, b in _make_backends().items() if b.unavailable() is None}
    )
    return [n for n in allowed_backends() if n in usable]
