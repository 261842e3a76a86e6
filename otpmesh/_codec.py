"""msgpack encoding of messages: plain data, tuples, torch tensors and actor refs. Never pickle.

Extension types (codes are part of the wire protocol, see docs/wire.md):

    1  tensor     u16 header length, msgpack header [dtype name, shape], raw little-endian bytes
    2  actor ref  msgpack of the ref's fields
    3  actor mesh msgpack of the mesh's fields
    4  tuple      msgpack array of the items
    5  value mesh msgpack [shape pairs, values]
    6  actor crash  msgpack [type name, message, traceback] (an exit reason)
    7  process exit msgpack [pid, how] (an exit reason)
    8  rdma buffer  msgpack map: the buffer's handle (owner, size, dtype, one entry per backend)
    9  channel tensor  a large tensor left in its sender's memory: the handle of a temporary
                    buffer; the receiver reads it over the tensor channel before delivery

torch is imported only when a tensor is met, so processes that never touch one never pay for it.
"""

from __future__ import annotations

import contextvars
import ctypes
import importlib
import os
import struct
import sys
from collections.abc import Callable
from typing import Any

import msgpack

from ._errors import EncodeError, ProtocolError

EXT_TENSOR = 1
EXT_ACTOR_REF = 2
EXT_ACTOR_MESH = 3
EXT_TUPLE = 4
EXT_VALUE_MESH = 5
EXT_ACTOR_CRASH = 6
EXT_PROCESS_EXIT = 7
EXT_RDMA_BUFFER = 8
EXT_CHANNEL_TENSOR = 9

_U16 = struct.Struct(">H")

# Types that travel as extensions besides tensors: type -> (code, to_data); code -> from_data.
# Filled by the modules that define those types (refs and meshes) when they are imported.
_ENCODERS: dict[type, tuple[int, Callable[[Any], Any]]] = {}
# Where each extension's type lives, so a process that never imported it can still decode it.
_DEFINED_IN = {
    EXT_ACTOR_REF: "otpmesh._mesh",
    EXT_ACTOR_MESH: "otpmesh._mesh",
    EXT_VALUE_MESH: "otpmesh._mesh",
    EXT_ACTOR_CRASH: "otpmesh._exits",
    EXT_PROCESS_EXIT: "otpmesh._exits",
    EXT_RDMA_BUFFER: "otpmesh.rdma._buffer",
}
_DECODERS: dict[int, Callable[[Any], Any]] = {}


def register_ext(
    cls: type, code: int, to_data: Callable[[Any], Any], from_data: Callable[[Any], Any]
) -> None:
    """Teach the codec to carry instances of `cls` as extension `code`."""
    _ENCODERS[cls] = (code, to_data)
    _DECODERS[code] = from_data


#: Tensors at least this big travel over the tensor channel (otpmesh.rdma), not inline.
CHANNEL_THRESHOLD = int(os.environ.get("OTPMESH_CHANNEL_THRESHOLD", str(1 << 20)))
# Set by otpmesh.rdma: registers a large tensor and returns its handle data (or None: inline).
large_tensor_hook: Callable[[Any], Any] | None = None
#: False while packing for a receiver in this same process (nothing to gain from the channel).
channel_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "otpmesh_channel_allowed", default=True
)
#: While set, the buffer ids the hook registers are appended here (their sender drops them).
offered: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "otpmesh_offered", default=None
)
# Placeholders for channel tensors met by the last unpack (see take_pending).
_pending: list[Any] = []


def take_pending() -> list[Any]:
    """The channel-tensor placeholders created by the last unpack(s), and forget them."""
    found = _pending[:]
    _pending.clear()
    return found


class PendingTensor:
    """A tensor still in its sender's memory: ``handle`` says where (otpmesh.rdma resolves it)."""

    __slots__ = ("handle",)

    def __init__(self, handle: Any) -> None:
        self.handle = handle


def _encode_tensor(t: Any) -> msgpack.ExtType:
    if t.layout is not sys.modules["torch"].strided:
        raise EncodeError(f"cannot send a {t.layout} tensor; convert it with .to_dense() first")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    nbytes = t.numel() * t.element_size()
    if nbytes >= CHANNEL_THRESHOLD and large_tensor_hook is not None and channel_allowed.get():
        handle = large_tensor_hook(t)
        if handle is not None:
            return msgpack.ExtType(EXT_CHANNEL_TENSOR, _pack(handle))
    header = _pack([str(t.dtype).removeprefix("torch."), list(t.shape)])
    raw: bytes | memoryview = b""
    if nbytes:
        # A view of the tensor's memory: the only copy is the join below.
        raw = memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")
    return msgpack.ExtType(EXT_TENSOR, b"".join((_U16.pack(len(header)), header, raw)))


def _decode_tensor(data: bytes) -> Any:
    import torch

    (hlen,) = _U16.unpack_from(data, 0)
    dtype_name, shape = msgpack.unpackb(data[2 : 2 + hlen])
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ProtocolError(f"unknown tensor dtype {dtype_name!r}")
    body = memoryview(data)[2 + hlen :]
    numel = 1
    for dim in shape:
        numel *= dim
    if len(body) != numel * dtype.itemsize:
        raise ProtocolError(
            f"tensor of shape {shape} and dtype {dtype_name} needs "
            f"{numel * dtype.itemsize} bytes, frame has {len(body)}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(body), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def _default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return msgpack.ExtType(EXT_TUPLE, _pack(list(obj)))
    entry = _ENCODERS.get(type(obj))
    if entry is not None:
        code, to_data = entry
        return msgpack.ExtType(code, _pack(to_data(obj)))
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _encode_tensor(obj)
    # strict_types sends subclasses here (bool-like ints, enums, OrderedDict, ...): use the base.
    bases: tuple[Callable[[Any], Any], ...] = (bool, int, float, str, bytes, dict, list)
    for base in bases:
        if isinstance(obj, base):  # type: ignore[arg-type]
            return base(obj)
    if isinstance(obj, bytearray | memoryview):
        return bytes(obj)
    raise EncodeError(
        f"cannot send a value of type {type(obj).__module__}.{type(obj).__qualname__}: "
        "messages carry msgpack data, tuples, torch tensors and actor refs (never pickle)"
    )


def _ext_hook(code: int, data: bytes) -> Any:
    if code == EXT_TUPLE:
        return tuple(_unpack(data))
    if code == EXT_TENSOR:
        return _decode_tensor(data)
    if code == EXT_CHANNEL_TENSOR:
        placeholder = PendingTensor(_unpack(data))
        _pending.append(placeholder)
        return placeholder
    from_data = _DECODERS.get(code)
    if from_data is None and code in _DEFINED_IN:
        importlib.import_module(_DEFINED_IN[code])  # registers its types (e.g. otpmesh.rdma)
        from_data = _DECODERS.get(code)
    if from_data is None:
        raise ProtocolError(f"unknown extension type {code}")
    return from_data(_unpack(data))


def _pack(obj: Any) -> bytes:
    try:
        return msgpack.packb(obj, default=_default, strict_types=True, use_bin_type=True)  # type: ignore[no-any-return]
    except EncodeError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise EncodeError(f"cannot encode message: {exc}") from exc


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def pack(obj: Any) -> bytes:
    """Encode one value (a whole message or a part of one)."""
    return _pack(obj)


def unpack(data: bytes) -> Any:
    """Decode one frame payload; any malformation is a ProtocolError."""
    try:
        return _unpack(data)
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"malformed frame ({type(exc).__name__}: {exc})") from exc
