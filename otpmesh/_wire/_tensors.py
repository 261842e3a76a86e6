"""Large values on the wire: torch tensors, numpy arrays and large bytes-likes, inline or left in
their sender's memory for the tensor channel (the codec, _codec.py, wraps what these give in
its extension types).

Large values ride the tensor channel when the sending node passes its ``offer``: tensors and
numpy arrays anywhere (msgpack hands them to the codec's ``_default``), and bytes, bytearray and
memoryview objects of CHANNEL_THRESHOLD bytes or more, which msgpack would pack itself: ``pack``
first wraps those in the message's lists, tuples and dicts (``lift``), when a cheap scan or the
packed size says there may be one. The receiver gets a ``PendingTensor`` in their place, for its
node's channel to fetch.

torch is imported only when a tensor is met, so processes that never touch one never pay for it;
numpy only when an array arrives (a sender meets arrays only if it imported numpy itself).
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import sys
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import msgpack

from .._core._errors import EncodeError, ProtocolError
from .._core._valuemesh import ValueMesh
from . import _payloads
from ._arrays import (
    VIEW_FORMATS,
    array_numel,
    check_sendable,
    shape_problem,
    split_header,
)
from ._arrays import inline as inline_array
from ._brief import brief
from ._framing import MAX_FRAME_SIZE

_U16 = struct.Struct(">H")

#: Tensors at least this big travel over the tensor channel (otpmesh.rdma), not inline.
CHANNEL_THRESHOLD = int(os.environ.get("OTPMESH_CHANNEL_THRESHOLD", str(1 << 20)))

#: Offers a large value to the sending node's tensor channel: a contiguous CPU torch tensor, or
#: the bytes of a bytes-like or numpy array as a flat memoryview (format 'B'; read-only when it
#: is a whole ``bytes``, which nobody can change). Returns its handle data, or None to send it
#: inline. A node passes its own to ``pack``; nothing is installed here.
Offer = Callable[[Any], Any]


class PendingTensor:
    """A large value still in its sender's memory: ``handle`` says where (the receiving node's
    tensor channel reads it); ``form`` says what to rebuild (None: a torch tensor; else the
    form of a channel buffer, see _codec.py's docstring). Packed again (a host agent relaying a
    reply), it travels as it came."""

    __slots__ = ("autograd", "form", "handle")

    def __init__(self, handle: Any, form: Any = None) -> None:
        self.handle = handle
        self.form = form
        self.autograd: str | None = None  # a tensor's autograd flag, applied once it is read


#: What a tensor's autograd state travels as (EXT_AUTOGRAD around the tensor): it requires grad,
#: it is an ``nn.Parameter`` (that does, or does not). The values travel, never the history.
AUTOGRAD_FLAGS = ("grad", "param", "param-frozen")


def autograd_flag(t: Any) -> str | None:
    """How `t` must arrive besides its values: None for a plain tensor (the usual case)."""
    if isinstance(t, sys.modules["torch"].nn.Parameter):
        return "param" if t.requires_grad else "param-frozen"
    return "grad" if t.requires_grad else None


def with_autograd(t: Any, flag: str | None) -> Any:
    """The received tensor `t` as its sender had it: requiring grad, or an ``nn.Parameter``
    (`flag` None: as it is)."""
    import torch

    if flag is None:
        return t
    if flag == "grad":
        return t.requires_grad_(True)
    return torch.nn.Parameter(t, requires_grad=flag == "param")


class Channelled(NamedTuple):
    """A value left in its sender's memory: what its extension's payload carries (the handle
    of a channel tensor; ``[form, handle]`` of a channel buffer)."""

    data: Any


class Packing:
    """What one ``pack`` call needs below its top level: the channel offer, and whether the
    receiver is in this same process (then nothing is offered and no size limit applies).

    ``offered`` records the handles offered for each value (by id) when a second packing of the
    same message may follow, which then ``replays`` them: a value is offered once per message."""

    __slots__ = ("local", "offer", "offered", "replays")

    def __init__(self, offer: Offer | None, local: bool) -> None:
        self.offer = offer
        self.local = local
        self.offered: dict[int, list[Any]] | None = None
        self.replays: dict[int, list[Any]] | None = None

    def handle_for(self, original: Any, prepared: Any) -> Any:
        """The channel handle for `original` (offered as `prepared`), or None: inline."""
        if self.replays is not None:
            handles = self.replays.get(id(original))
            if handles:
                return handles.pop(0)
        if self.offer is None:
            return None
        handle = self.offer(prepared)
        if self.offered is not None:
            self.offered.setdefault(id(original), []).append(handle)
        return handle


#: A packing with no channel, to a receiver in another process.
PLAIN = Packing(None, False)


class Blob:
    """A bytes, bytearray or memoryview of CHANNEL_THRESHOLD bytes or more, wrapped by ``lift``
    so that msgpack hands it to the codec's ``_default`` (which offers it to the channel)."""

    __slots__ = ("value",)

    def __init__(self, value: bytes | bytearray | memoryview) -> None:
        self.value = value


def _check_empty_shape(shape: list[int], kind: str) -> None:
    """EncodeError for a zero-element value whose shape its receiver would refuse (the bounds
    in ``_arrays.py``): refused here, where the sender can fix it, not by closing the
    connection there."""
    problem = shape_problem(shape, kind)
    if problem is not None:
        raise EncodeError(
            f"cannot send it: {problem}; an empty value needs no such shape, send "
            "value.reshape(0) (and its shape as a list, if the receiver needs it)"
        )


def encode_tensor(original: Any, how: Packing) -> bytes | Channelled:
    """A torch tensor: the payload of its inline form, or its handle on the channel."""
    t = original
    if t.layout is not sys.modules["torch"].strided:
        raise EncodeError(f"cannot send a {t.layout} tensor; convert it with .to_dense() first")
    t = t.detach()
    if t.device.type == "meta":
        raise EncodeError(
            f"cannot send a meta tensor (shape {list(t.shape)}, {t.dtype}): it has no data; "
            "materialize it first (torch.empty_like(t, device='cpu')), or send its shape and dtype"
        )
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    nbytes = t.numel() * t.element_size()
    if nbytes >= CHANNEL_THRESHOLD and how.offer is not None:
        handle = how.handle_for(original, t)
        if handle is not None:
            return Channelled(handle)
    if nbytes > MAX_FRAME_SIZE and not how.local:
        raise EncodeError(
            f"cannot send a tensor of {nbytes} bytes inline: a frame carries at most "
            f"{MAX_FRAME_SIZE} bytes; send it from a running otpmesh node (large tensors go "
            "over the tensor channel) or as an otpmesh.rdma.RDMABuffer"
        )
    shape = list(t.shape)
    if not nbytes:
        _check_empty_shape(shape, "tensor")
    header = msgpack.packb([str(t.dtype).removeprefix("torch."), shape])
    raw: bytes | memoryview = b""
    if nbytes:
        # A view of the tensor's memory: the only copy is the join below.
        raw = memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")
    return b"".join((_U16.pack(len(header)), header, raw))


def decode_tensor(data: bytes) -> Any:
    """The torch tensor of an inline tensor's payload; ProtocolError if it is malformed."""
    import torch

    header, body = split_header(data, "tensor")
    dtype_name, shape = header
    # The module's own namespace, not getattr: no lazy submodule import, nothing but a dtype.
    dtype = vars(torch).get(dtype_name) if isinstance(dtype_name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ProtocolError(f"unknown tensor dtype {brief(dtype_name)}")
    numel = array_numel(shape, "tensor")
    if len(body) != numel * dtype.itemsize:
        raise ProtocolError(
            f"tensor of shape {brief(shape)} and dtype {dtype_name} needs "
            f"{numel * dtype.itemsize} bytes, frame has {len(body)}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(body), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def encode_array(a: Any, how: Packing) -> bytes | Channelled:
    """A numpy array: the payload of its inline form or, from CHANNEL_THRESHOLD bytes, its
    form and handle on the channel (a channel buffer)."""
    numpy = sys.modules["numpy"]
    if type(a) is not numpy.ndarray:
        raise EncodeError(
            f"cannot send a {type(a).__module__}.{type(a).__qualname__} (a numpy array "
            "subclass): send numpy.asarray(value), or its parts, explicitly"
        )
    dt = a.dtype
    check_sendable(dt)
    contiguous = a if a.flags.c_contiguous else a.copy(order="C")
    flat = contiguous.reshape(-1).view(numpy.uint8)
    nbytes = int(flat.nbytes)
    shape = [int(d) for d in a.shape]
    if not nbytes:
        _check_empty_shape(shape, "numpy array")
    if nbytes >= CHANNEL_THRESHOLD and how.offer is not None:
        handle = how.handle_for(a, memoryview(flat))
        if handle is not None:
            return Channelled([["ndarray", dt.str, shape], handle])
    if nbytes > MAX_FRAME_SIZE and not how.local:
        raise EncodeError(
            f"cannot send a numpy array of {nbytes} bytes inline: a frame carries at most "
            f"{MAX_FRAME_SIZE} bytes; send it from a running otpmesh node (large arrays go "
            "over the tensor channel)"
        )
    return inline_array(dt.str, shape, memoryview(flat))


def encode_blob(value: bytes | bytearray | memoryview, how: Packing) -> bytes | Channelled:
    """A large bytes-like (wrapped by ``lift``): its form and handle on the channel, or the
    bytes msgpack would have packed (bin)."""
    form: Any
    if isinstance(value, memoryview):
        shape = list(value.shape or ())
        fmt = value.format
        flat = value.cast("B") if value.c_contiguous else memoryview(value.tobytes())
        if fmt in VIEW_FORMATS and 0 not in shape:
            form = ["memoryview", fmt, shape]
        else:
            form = ["memoryview", "B", [flat.nbytes]]
    else:
        form = "bytes" if isinstance(value, bytes) else "bytearray"
        flat = memoryview(value)
    handle = how.handle_for(value, flat) if how.offer is not None else None
    if handle is None:
        return bytes(value)
    return Channelled([form, handle])


def lift(obj: Any, levels: int) -> Any:
    """`obj` with every bytes-like of CHANNEL_THRESHOLD bytes or more in its lists, tuples,
    dicts and value meshes (`levels` deep) wrapped as a ``Blob``; `obj` itself if none was."""
    if isinstance(obj, bytes | bytearray):
        return Blob(obj) if len(obj) >= CHANNEL_THRESHOLD else obj
    if isinstance(obj, memoryview):
        return Blob(obj) if obj.nbytes >= CHANNEL_THRESHOLD else obj
    if levels <= 0:
        return obj
    if isinstance(obj, list | tuple):
        if _only_scalars(obj):  # a long list of numbers: nothing to lift, no walk in Python
            if len(obj) >= HUGE_LIST:
                _hint_huge(len(obj))
            return obj
        items = [lift(item, levels - 1) for item in obj]
        if all(new is old for new, old in zip(items, obj, strict=True)):
            return obj
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, dict):
        if _only_scalars(obj.values()):
            return obj
        lifted = {key: lift(value, levels - 1) for key, value in obj.items()}
        if all(lifted[key] is value for key, value in obj.items()):
            return obj
        return lifted
    if type(obj) is ValueMesh:
        values = obj.values()
        new = lift(values, levels - 1)
        return obj if new is values else ValueMesh(dict(obj.shape.items()), new)
    return obj


#: A list this long in a message is said once (``_hint_huge``).
HUGE_LIST = 1_000_000
_HINTED: list[bool] = []


def _hint_huge(length: int) -> None:
    if not _HINTED:
        _HINTED.append(True)
        logging.getLogger("otpmesh.wire").warning(
            "a list of %d values is in a message: it travels value by value (about 0.25 s "
            "per million); a torch tensor or numpy array of the same numbers goes over the "
            "tensor channel, tens of times faster (said once per process)",
            length,
        )


#: What ``lift`` never wraps nor looks into.
_SCALAR_TYPES = frozenset((int, float, str, bool, type(None)))


def _only_scalars(items: Iterable[Any]) -> bool:
    """Whether `items` are all numbers, strings or None (exact types, found at C speed: a list
    of 5 million ints took 11 s to walk item by item, 0.1 s this way)."""
    return set(map(type, items)) <= _SCALAR_TYPES


_FORM = (str, list)  # a channel buffer's form: "bytes", "bytearray" or [kind, item, shape]


def pending_buffer(payload: Any) -> PendingTensor:
    """The placeholder of a channel buffer's decoded payload ``[form, handle]``; ProtocolError
    unless its form is one a channel buffer may have (_codec.py's docstring). The channel
    checks the handle, and the item type against it, before it reads anything."""
    form, handle = _payloads.fields(payload, "channel buffer", (_FORM, (dict,)))
    if type(form) is str:
        if form not in ("bytes", "bytearray"):
            raise ProtocolError(f"unknown channel buffer form {brief(form)}")
        return PendingTensor(handle, form)
    kind, _item, shape = _payloads.fields(
        form, "channel buffer form", (_payloads.STR, _payloads.STR, _payloads.LIST)
    )
    if kind not in ("memoryview", "ndarray"):
        raise ProtocolError(f"unknown channel buffer form {brief(form)}")
    problem = shape_problem(shape, kind)
    if problem is not None:
        raise ProtocolError(problem)
    return PendingTensor(handle, form)
