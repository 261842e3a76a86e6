"""The tensor channel of one node: large values in ordinary calls travel over it, transparently.

When a message holds a tensor, numpy array, bytes, bytearray or memoryview of at least
``OTPMESH_CHANNEL_THRESHOLD`` bytes (1 MiB by default), the sender's node offers it here: it
copies it once, as it is when sent (a whole ``bytes`` needs no copy: nobody can change it),
registers the copy as a temporary read-only buffer, and the handle travels instead of the bytes.
The receiving node takes it before the message is delivered and rebuilds the sender's type. From
``MAP_ABOVE`` bytes the copy is a sealed memory file (``_snapshot.py``) that receivers of this host
map copy-on-write (no further copy, however many receive it); below, or on other hosts, each
receiver reads the copy over the best backend into fresh memory. Either way what the receiver
gets is its own (a ``bytes`` is copied out of a mapping: it owns its memory). Messages from one
connection are still delivered in order.

A temporary buffer is dropped when its readers are done: a reply's by its one reader, a call's by
its caller when the call ends, a cast's after as many reads as it had targets. Whatever happens
to them (a reader dies, a target was unreachable), it is dropped ``TEMP_TTL`` s after it was sent,
by the registry's own timer.

Whoever makes a node (the controller, each worker) passes ``Channel`` in; it uses node methods only.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import struct
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._core._errors import ProtocolError
from .._core._valuemesh import ValueMesh
from .._node._node import Node
from .._wire._arrays import VIEW_FORMATS, array_dtype, array_numel
from .._wire._connection import Connection
from .._wire._frames import ERR, OK, remote_error
from .._wire._tensors import PendingTensor, with_autograd
from ._backend import Region
from ._buffer import RDMABuffer
from ._error import RDMAError
from ._handle import Handle, check_matches
from ._pool import LOCAL, from_any_thread
from ._requests import ServingRegistry
from ._snapshot import available as snapshots_available
from ._snapshot import end_when_freed, map_private

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


def _raw_address(view: memoryview) -> int | None:
    """The address of a flat byte view's memory, or None when it cannot be had in place (a
    read-only view of anything but a whole ``bytes``)."""
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    if type(view.obj) is bytes and view.nbytes == len(view.obj):
        return ctypes.cast(ctypes.c_char_p(view.obj), ctypes.c_void_p).value
    return None


_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)


def _fresh_bytes(nbytes: int) -> Any:
    """Writable memory that is a new ``bytes`` of `nbytes` (its ``filled`` attribute), for a
    reader to fill before anything else sees it: the C API's own way to build a bytes
    (``PyBytes_FromStringAndSize(NULL, n)``), so a large bytes is read once, not read into a
    bytearray and copied again. `nbytes` > 1 (smaller ones are shared singletons)."""
    made = _new_bytes(None, nbytes)
    memory = (ctypes.c_char * nbytes).from_address(_raw_address(memoryview(made)) or 0)
    memory.filled = made  # type: ignore[attr-defined]  # keeps the bytes alive with its memory
    return memory


def _filled(raw: Any) -> bytes:
    made = getattr(raw, "filled", None)
    return made if type(made) is bytes else bytes(memoryview(raw).cast("B"))


def _rebuilder(form: Any, handle: Handle) -> Callable[[Any], Any]:
    """How to rebuild a channel buffer of `form` from its bytes (a bytearray or a mapping),
    after checking that the form fits the handle; RDMAError for a malformed one, before
    anything is asked or allocated."""
    if handle.dtype is not None or handle.shape is not None:
        raise RDMAError(f"a channel buffer's handle names a tensor ({handle.describe()})")
    if form == "bytes":
        return _filled
    if form == "bytearray":
        return lambda raw: raw if type(raw) is bytearray else bytearray(memoryview(raw).cast("B"))
    if not (type(form) is list and len(form) == 3 and form[0] in ("memoryview", "ndarray")):
        raise RDMAError(f"malformed channel buffer form {str(form)[:80]!r}")
    kind, item, shape = form
    try:
        numel = array_numel(shape)
        if kind == "memoryview":
            if item not in VIEW_FORMATS and item != "B":
                raise RDMAError(f"a channel memoryview of format {str(item)[:20]!r}")
            itemsize = struct.calcsize(item)
        else:
            try:
                dtype = array_dtype(item)
            except ImportError:
                raise RDMAError(
                    "a numpy array arrived, but numpy is not installed in this process"
                ) from None
            itemsize = dtype.itemsize
    except ProtocolError as exc:
        raise RDMAError(f"malformed channel buffer form: {exc}") from None
    if numel * itemsize != handle.nbytes:
        raise RDMAError(
            f"a channel buffer's form {str(form)[:80]!r} needs {numel * itemsize} bytes, its "
            f"handle says {handle.nbytes}"
        )
    if kind == "memoryview":
        return lambda raw: memoryview(raw).cast("B").cast(item, shape)
    numpy = sys.modules["numpy"]  # array_dtype imported it
    return lambda raw: numpy.frombuffer(raw, dtype=numpy.uint8).view(dtype).reshape(shape)


def _raw_over(memory: Any, handle: Handle) -> Any:
    return memory


def _build(build: Callable[[Any], Any], raw: Any, form: Any) -> Any:
    try:
        return build(raw)
    except (TypeError, ValueError) as exc:  # a form that numpy or memoryview refuses
        raise RDMAError(
            f"cannot rebuild a channel buffer of form {str(form)[:80]!r}: {exc}"
        ) from None


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
        self._registry: ServingRegistry | None = None

    @property
    def registry(self) -> ServingRegistry:
        """The node's buffers and backends (made on first use: a process that never moves a
        large tensor never looks for RDMA devices)."""
        if self._registry is None:
            self._registry = ServingRegistry(self.node)
        return self._registry

    def offer(self, value: Any, collect: list[int] | None) -> Any:
        # Copied now: the receivers get the value as it was when sent, whatever the sender
        # does to it later (and a broadcast costs this one copy, when receivers map it).
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            buf = self._offer_tensor(value)
        else:
            buf = self._offer_bytes(value)
        handle = buf._handle
        self.registry.expire(handle.buffer, trio.current_time() + TEMP_TTL)
        if collect is not None:
            collect.append(handle.buffer)  # a call's arguments: dropped when the call ends
        return handle.to_wire()

    def _offer_tensor(self, tensor: Any) -> RDMABuffer:
        nbytes = tensor.numel() * tensor.element_size()
        dtype = str(tensor.dtype).removeprefix("torch.")
        shape = tuple(tensor.shape)
        if nbytes >= MAP_ABOVE and snapshots_available():
            region = Region(tensor.data_ptr(), nbytes)
            return RDMABuffer._offered(self.node, tensor, region, dtype, shape, snapshot=True)
        copy = _copy_of(tensor)
        region = Region(copy.data_ptr(), nbytes)
        return RDMABuffer._offered(self.node, copy, region, dtype, shape, snapshot=False)

    def _offer_bytes(self, view: memoryview) -> RDMABuffer:
        """A flat byte view (of a bytes-like or a numpy array), registered raw: the receiver
        rebuilds the type from the form that travels beside the handle."""
        address = _raw_address(view)
        # A whole ``bytes`` is registered in place, whatever its size: nobody can change it,
        # so it needs no copy (readers copy from it; a bytes receiver copies anyway).
        in_place = address is not None and view.readonly
        mapped = not in_place and view.nbytes >= MAP_ABOVE and snapshots_available()
        if address is None or (not mapped and not view.readonly):
            view = memoryview(bytes(view))  # a copy nobody can change: registered in place
            address = _raw_address(view)
        region = Region(address or 0, view.nbytes)
        return RDMABuffer._offered(self.node, view.obj, region, None, None, snapshot=mapped)

    def release_after(self, buffer_ids: list[int], readers: int) -> None:
        reg = self.registry
        for buffer_id in buffer_ids:
            reg.release_after(buffer_id, readers)

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
            # A malformed one fails before anything is asked or allocated, and nothing is
            # allocated before the owner vouched for the handle (a forged size allocates none).
            if placeholder.form is None:
                _tensor_dtype(handle)
                tensor = await buf._read_new(
                    functools.partial(self._receive_tensor, handle),
                    functools.partial(self._mapped, handle, _tensor_over),
                )
                found[id(placeholder)] = with_autograd(tensor, placeholder.autograd)
            else:
                build = _rebuilder(placeholder.form, handle)
                raw = await buf._read_new(
                    functools.partial(self._receive_raw, handle, placeholder.form),
                    functools.partial(self._mapped, handle, _raw_over),
                )
                found[id(placeholder)] = _build(build, raw, placeholder.form)
            if drop:
                buf.drop()
        return _substitute(msg, found)

    def _receive_tensor(self, handle: Handle) -> Any:
        """A tensor to read `handle`'s value into: in warm memory of the node's receive pool
        from ``MAP_ABOVE`` bytes (``_receive.py``), else a new one (malloc reuses warm memory
        below that)."""
        if handle.nbytes < MAP_ABOVE:
            return _empty_like(handle)
        return _tensor_over(self.registry.receive.take(handle.nbytes), handle)

    def _receive_raw(self, handle: Handle, form: Any) -> Any:
        """Memory to read a buffer of `form` into: a ``bytes`` or ``bytearray`` owns its memory
        (a new bytes, filled in place; a new bytearray); a numpy array or memoryview lies in a
        receive pool block, as a tensor does."""
        if form == "bytes" and handle.nbytes > 1:
            return _fresh_bytes(handle.nbytes)
        if handle.nbytes < MAP_ABOVE or form == "bytearray":
            return bytearray(handle.nbytes)
        return self.registry.receive.take(handle.nbytes)

    def _mapped(
        self,
        handle: Handle,
        over: Callable[[Any, Handle], Any],
        backend: str,
        entry: dict[str, Any],
        fd: int,
        end_lease: Callable[[bool], None],
    ) -> Any:
        """The owner's snapshot of `handle`'s value mapped copy-on-write (as `over` makes it)
        from `fd` (the file the owner passed with its grant; the caller closes it), if this
        process can map it; else None (the caller copies). Once the mapping is gone,
        `end_lease` tells the owner so (it may refill the file then)."""
        if backend != "shm" or not handle.nbytes:
            return None
        try:
            memory = map_private(fd, handle.nbytes)
        except OSError as exc:  # a lying owner (not a sealed file, too small): copy instead
            log.warning("tensor channel: cannot map buffer %s, copying it: %s", handle.buffer, exc)
            return None
        taken = over(memory, handle)
        end_when_freed(memory, end_lease)  # only now: until over() returned, the pin's lease holds
        return taken

    def fetch_local(self, value: Any, pending: list[PendingTensor]) -> Any:
        """A message between two actors of this process: map (or copy) from our own registry."""
        reg = self.registry
        found: dict[int, Any] = {}
        for placeholder in pending:
            handle = Handle.from_wire(placeholder.handle)
            entry = reg.check(handle.buffer, handle.token)
            check_matches(handle, entry.region.nbytes, entry.dtype, entry.shape)
            form = placeholder.form
            build = None if form is None else _rebuilder(form, handle)
            got: Any
            if entry.snapshot is not None:
                end = functools.partial(reg.unmapped, LOCAL, handle.buffer, handle.token)
                memory = map_private(entry.snapshot.fd, handle.nbytes)
                reg.lease(entry, LOCAL)
                end_when_freed(memory, from_any_thread(end))
                got = _tensor_over(memory, handle) if build is None else memory
            elif build is None:
                got = _empty_like(handle)
                ctypes.memmove(got.data_ptr(), entry.region.address, handle.nbytes)
            else:
                fresh = form == "bytes" and handle.nbytes > 1
                got = _fresh_bytes(handle.nbytes) if fresh else bytearray(handle.nbytes)
                ctypes.memmove(
                    (ctypes.c_char * handle.nbytes).from_buffer(got),
                    entry.region.address,
                    handle.nbytes,
                )
            # One read over: a cast's buffer goes after its last reader; a call's stays until
            # the call ends (its other targets may not have read it yet).
            reg.taken(handle.buffer)
            found[id(placeholder)] = got if build is None else _build(build, got, form)
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
