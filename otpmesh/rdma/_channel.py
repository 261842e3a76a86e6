"""The tensor channel of one node: large tensors in ordinary calls travel over it, transparently.

When a message holds a tensor of at least ``OTPMESH_CHANNEL_THRESHOLD`` bytes (1 MiB by default),
the sender's node offers it here: it copies the tensor once, as it is when sent, registers the
copy as a temporary buffer, and the handle travels instead of the bytes. The receiving node takes
it before the message is delivered, then lets the sender drop it. From ``MAP_ABOVE`` bytes the
copy is a sealed memory file (``_snapshot.py``) that receivers of this host map copy-on-write (no
further copy, however many receive it); below, or on other hosts, each receiver reads the copy
over the best backend into a fresh tensor. Either way the receiver's tensor is its own. Messages
from one connection are still delivered in order. A temporary buffer nobody fetched is dropped
after ``TEMP_TTL`` s.

Every otpmesh process that runs a node passes ``Channel`` in when it makes it (the controller,
each worker); the channel uses only the node's public methods.
"""

from __future__ import annotations

import ctypes
import functools
import logging
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
from ._snapshot import available as snapshots_available
from ._snapshot import map_private

TEMP_TTL = 300.0
#: From this size a channel tensor's copy is a memory file that readers map. Below it, a plain
#: clone that readers copy is faster (measured: 1-16 MiB, ~2x): malloc reuses warm pages there,
#: while each memory file's pages are new (glibc maps allocations above 32 MiB fresh anyway).
MAP_ABOVE = 32 << 20
log = logging.getLogger("otpmesh.rdma")


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


def _copy_of(tensor: Any) -> Any:
    """A copy of a contiguous CPU tensor, by one memmove: ``clone`` wakes torch's thread pool,
    which costs more than the copy at these sizes on a busy host (measured: 1 MiB, ~7 ms)."""
    import torch

    copy = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    ctypes.memmove(copy.data_ptr(), tensor.data_ptr(), tensor.numel() * tensor.element_size())
    return copy


def _tensor_over(memory: Any, handle: Handle) -> Any:
    """A tensor over `memory` (a mapped snapshot), shaped as `handle` says; it keeps the mapping
    alive, and the mapping goes when the last tensor over it does."""
    import torch

    flat = torch.frombuffer(memory, dtype=_tensor_dtype(handle))
    return flat.reshape(list(handle.shape or ()))


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
        # Copied now: the receivers get the tensor as it was when sent, whatever the sender
        # does to it later (and a broadcast costs this one copy, when receivers map it).
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes >= MAP_ABOVE and snapshots_available():
            buf = RDMABuffer._register(self.node, tensor, snapshot=True)
        else:
            buf = RDMABuffer._register(self.node, _copy_of(tensor))
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
            found[id(placeholder)] = await buf._read_new(
                functools.partial(_empty_like, handle), functools.partial(self._mapped, handle)
            )
            if drop:
                buf.drop()
        return _substitute(msg, found)

    def _mapped(self, handle: Handle, backend: str, entry: dict[str, Any], pid: int) -> Any:
        """The owner's snapshot of `handle`'s tensor mapped copy-on-write, if the grant offers
        one this process can map; else None (the caller copies)."""
        fd = entry.get("memfd")
        if backend != "shm" or type(fd) is not int or fd < 0 or not handle.nbytes:
            return None
        try:
            memory = map_private(fd, handle.nbytes, pid=pid)
        except OSError as exc:  # pidfd_getfd refused, a lying owner: copy instead
            log.warning("tensor channel: cannot map buffer %s, copying it: %s", handle.buffer, exc)
            return None
        return _tensor_over(memory, handle)

    def fetch_local(self, value: Any, pending: list[PendingTensor]) -> Any:
        """A message between two actors of this process: map (or copy) from our own registry."""
        reg = self.registry
        found: dict[int, Any] = {}
        for placeholder in pending:
            handle = Handle.from_wire(placeholder.handle)
            entry = reg.check(handle.buffer, handle.token)
            check_matches(handle, entry.region.nbytes, entry.dtype, entry.shape)
            if entry.snapshot is not None:
                tensor = _tensor_over(map_private(entry.snapshot.fd, handle.nbytes), handle)
            else:
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
