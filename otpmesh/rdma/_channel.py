"""The tensor channel of one node: large tensors in ordinary calls travel over it, transparently.

When a message holds a tensor of at least ``OTPMESH_CHANNEL_THRESHOLD`` bytes (1 MiB by default),
the sender's node offers it here: it is registered as a temporary buffer and its handle travels
instead of its bytes; the receiving node reads it (shm on one host: the kernel copies straight
from the sender's memory) before the message is delivered, then lets the sender drop it. Messages
from one connection are still delivered in order. A temporary buffer nobody fetched is dropped
after ``TEMP_TTL`` s.

Every otpmesh process that runs a node passes ``Channel`` in when it makes it (the controller,
each worker); the channel uses only the node's public methods.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Awaitable
from typing import Any

import trio

from .._core._valuemesh import ValueMesh
from .._node._node import Node
from .._wire._codec import PendingTensor
from .._wire._connection import Connection
from .._wire._frames import ERR, OK, remote_error
from ._buffer import RDMABuffer
from ._error import RDMAError
from ._handle import Handle, check_matches
from ._registry import Registry

TEMP_TTL = 300.0


def _substitute(value: Any, found: dict[int, Any]) -> Any:
    if isinstance(value, PendingTensor):
        return found[id(value)]
    if isinstance(value, list):
        return [_substitute(v, found) for v in value]
    if isinstance(value, tuple):
        return tuple(_substitute(v, found) for v in value)
    if isinstance(value, dict):
        return {k: _substitute(v, found) for k, v in value.items()}
    if isinstance(value, ValueMesh):
        return ValueMesh(value.shape, _substitute(value.values(), found))
    return value


def _tensor_dtype(handle: Handle) -> Any:
    """The torch dtype a channel tensor's handle names, checked against its size."""
    import torch

    dtype = vars(torch).get(handle.dtype or "")  # never getattr: it can import submodules
    if not isinstance(dtype, torch.dtype) or handle.shape is None:
        raise RDMAError(
            f"a channel tensor's handle names no torch dtype and shape: {handle.dtype!r}, "
            f"{handle.shape!r}"
        )
    numel = 1
    for dim in handle.shape:
        numel *= dim
    if numel * dtype.itemsize != handle.nbytes:
        raise RDMAError(
            f"a channel tensor's handle says {handle.nbytes} bytes for "
            f"{handle.dtype}{list(handle.shape)}, which needs {numel * dtype.itemsize}"
        )
    return dtype


def _empty_like(handle: Handle) -> Any:
    import torch

    return torch.empty(list(handle.shape or ()), dtype=_tensor_dtype(handle))


class Channel:
    """One node's tensor channel (implements the node's ``TensorChannel``): its registry of
    buffers, made on first use, and the transfers of large tensors in calls and replies."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._registry: Registry | None = None

    @property
    def registry(self) -> Registry:
        """The node's buffers and backends (made on first use: a process that never moves a
        large tensor never looks for RDMA devices)."""
        if self._registry is None:
            self._registry = Registry(self.node)
        return self._registry

    def offer(self, tensor: Any, collect: list[int] | None) -> Any:
        buf = RDMABuffer._register(self.node, tensor)
        handle = buf._handle
        self.registry.expire(handle.buffer, trio.current_time() + TEMP_TTL)
        if collect is not None:
            collect.append(handle.buffer)  # a call's arguments: dropped when the call ends
        return handle.to_wire()

    def drop_offered(self, buffer_ids: list[int]) -> None:
        reg = self.registry
        for buffer_id in buffer_ids:
            reg.drop(buffer_id)

    async def fetch(self, msg: Any, pending: list[PendingTensor], drop: bool) -> Any:
        """Read every channel tensor of `msg` into a local tensor; return the message with them.
        `drop`: this is the only reader (a reply), so release the sender's buffers at once; a
        call's arguments may go to many actors, and its caller drops them when the call ends."""
        found: dict[int, Any] = {}
        for placeholder in pending:
            buf = RDMABuffer._from_wire(placeholder.handle)
            handle = buf._handle
            _tensor_dtype(handle)  # a malformed one fails before anything is asked or allocated
            # Allocated only once the owner vouched for the handle: a forged one cannot make
            # this process allocate whatever shape it names.
            found[id(placeholder)] = await buf._read_new(functools.partial(_empty_like, handle))
            if drop:
                buf.drop()
        return _substitute(msg, found)

    def fetch_local(self, value: Any, pending: list[PendingTensor]) -> Any:
        """A message between two actors of this process: copy from our own registry."""
        reg = self.registry
        found: dict[int, Any] = {}
        for placeholder in pending:
            handle = Handle.from_wire(placeholder.handle)
            entry = reg.check(handle.buffer, handle.token)
            check_matches(handle, entry.region.nbytes, entry.dtype, entry.shape)
            tensor = _empty_like(handle)
            ctypes.memmove(tensor.data_ptr(), entry.region.address, handle.nbytes)
            reg.drop(handle.buffer)
            found[id(placeholder)] = tensor
        return _substitute(value, found)

    def deliver_later(
        self, conn: Connection, msg: list[Any], pending: list[PendingTensor]
    ) -> Awaitable[None]:
        """The read loop awaits this: later frames of the connection wait, so order is kept."""

        async def resolve() -> None:
            try:
                resolved = await self.fetch(msg, pending, drop=msg[0] in (OK, ERR))
            except Exception as exc:
                self._fail(conn, msg, exc)
                return
            waiting = self.node.dispatch(conn, resolved)
            if waiting is not None:
                await waiting

        return resolve()

    def _fail(self, conn: Connection, msg: list[Any], exc: Exception) -> None:
        kind = msg[0]
        text = f"a large tensor of this message could not be fetched: {exc}"
        if kind == OK or kind == ERR:
            entry = conn.pending.pop(msg[1], None)
            if entry is not None:
                group, index = entry
                failure = remote_error(
                    group.paths[index], [ERR, msg[1], "raised", "RDMAError", text, ""]
                )
                group.deliver(index, False, failure)
        elif kind == 0:  # a call: its caller hears why
            self.node.reply_error((conn, msg[1]), "RDMAError", text, "")
