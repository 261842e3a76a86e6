"""msgpack encoding of messages: plain data, tuples, tensors, arrays and actor refs. Never pickle.

Extension types (codes are part of the wire protocol, see docs/wire.md):

    1  tensor     u16 header length, msgpack header [dtype name, shape], raw little-endian bytes
    2  actor ref  msgpack of the ref's fields
    3  actor mesh msgpack of the mesh's fields
    4  tuple      msgpack array of the items
    5  value mesh msgpack [shape pairs, values]
    6  actor crash  msgpack [type name, message, traceback, endpoint?] (an exit reason)
    7  process exit msgpack [pid, how] (an exit reason)
    8  rdma buffer  msgpack map: the buffer's handle (owner, size, dtype, one entry per backend)
    9  channel tensor  a large tensor left in its sender's memory: the handle of a temporary
                    buffer; the receiver reads it over the tensor channel before delivery
   10  array       a numpy array: u16 header length, msgpack header [dtype str, shape], raw bytes
   11  channel buffer  a large bytes, bytearray, memoryview or numpy array left in its sender's
                    memory: msgpack [form, handle], where form is "bytes", "bytearray",
                    ["memoryview", format, shape] or ["ndarray", dtype str, shape]; the receiver
                    reads it as a channel tensor and rebuilds that type
   12  hung        msgpack [endpoint, seconds, how, stacks] (an exit reason)

Extension values nest (a tuple of tuples, a tensor in a tuple in a value mesh): each one met
inside another's payload is one level, and at most MAX_NESTING levels travel. The limit is the
same both ways: the sender raises EncodeError, the receiver ProtocolError (closing only that
connection). Plain lists and maps nest within one payload without counting here: msgpack's C
unpacker walks them iteratively and refuses more than 1024 levels (StackError).

What a decode costs is bounded by its bytes: no decode allocates more than a small multiple of
its frame's size (measured, msgpack 1.2 and torch 2.13: at most ~75x, for a frame of
one-element tensors, each a torch object of ~1.2 KiB from 17 bytes; msgpack's own empty lists
and maps cost ~60x, an actor ref ~56x, everything else less), and every malformed payload is a
ProtocolError (closing only the connection it came on). msgpack bounds its own work by the
bytes; every extension checks its payload's type and arity, field by field, before it builds
anything (``_payloads.py``), so no code here walks a value that is not what its bytes hold; and
a zero-element tensor or array, which carries no bytes, has its dims bounded instead
(``_arrays.py``): ``[2**31, 0]`` as the payload of a crash once made a decoder walk 2**31 rows
out of 27 bytes. The sender refuses, as EncodeError, what its receiver would refuse.

torch is imported only when a tensor is met, so processes that never touch one never pay for it;
numpy only when an array arrives (a sender meets arrays only if it imported numpy itself).

Large values ride the tensor channel when the sending node passes its ``offer``: tensors and
numpy arrays anywhere (msgpack hands them to ``_default``), and bytes, bytearray and memoryview
objects of CHANNEL_THRESHOLD bytes or more, which msgpack would pack itself: ``pack`` first wraps
those in the message's lists, tuples and dicts (``_lift``), when a cheap scan or the packed size
says there may be one.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import struct
import sys
from collections.abc import Callable, Collection, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any

import msgpack

from .._core._errors import EncodeError, ProtocolError
from .._core._exits import ActorCrash, Hung, ProcessExit
from .._core._valuemesh import ValueMesh
from . import _payloads
from ._arrays import (
    MAX_DIMS,
    VIEW_FORMATS,
    array_numel,
    check_sendable,
    decode_array,
    shape_problem,
    split_header,
)
from ._arrays import inline as inline_array
from ._brief import brief
from ._framing import MAX_FRAME_SIZE

EXT_TENSOR = 1
EXT_ACTOR_REF = 2
EXT_ACTOR_MESH = 3
EXT_TUPLE = 4
EXT_VALUE_MESH = 5
EXT_ACTOR_CRASH = 6
EXT_PROCESS_EXIT = 7
EXT_RDMA_BUFFER = 8
EXT_CHANNEL_TENSOR = 9
EXT_ARRAY = 10
EXT_CHANNEL_BUFFER = 11
EXT_HUNG = 12

_U16 = struct.Struct(">H")

#: How many extension values may nest inside one another (see the module docstring). Each level
#: is one more msgpack call on the C stack, so the limit is what keeps the stack bounded. Measured
#: (msgpack 1.2, CPython 3.11, 8 MiB stack: the main thread and Linux's default thread stack):
#: decoding costs ~43 KiB a level (the C unpacker's context lives on the stack) and 195 levels
#: died with SIGSEGV; encoding costs up to ~430 KiB a level when each level also holds lists
#: nested to msgpack's own limit (1024), and 20 such levels died. 8 levels need at most ~3.4 MiB
#: (0.35 MiB to decode): a wide margin, and deeper than the messages programs send (a value mesh
#: of tuples of tensors is 3).
MAX_NESTING = 8
#: Most dimensions a tensor on the wire may have (torch itself caps tensors at 64 dims).
MAX_TENSOR_DIMS = MAX_DIMS
# The cheap size check before packing looks this many containers deep (a call's [method, args,
# kwargs], its arguments, their items), into containers of at most this many items: a bound on
# its cost on the hot path. The size after packing is checked too, for what this misses.
_SCAN_LEVELS = 3
_SCAN_ITEMS = 32
# How deep in lists, tuples and dicts a large bytes-like is found for the channel (deeper ones
# travel inline): a bound on the walk's recursion.
_LIFT_LEVELS = 32

#: Tensors at least this big travel over the tensor channel (otpmesh.rdma), not inline.
CHANNEL_THRESHOLD = int(os.environ.get("OTPMESH_CHANNEL_THRESHOLD", str(1 << 20)))

#: Offers a large value to the sending node's tensor channel: a contiguous CPU torch tensor, or
#: the bytes of a bytes-like or numpy array as a flat memoryview (format 'B'; read-only when it
#: is a whole ``bytes``, which nobody can change). Returns its handle data, or None to send it
#: inline. A node passes its own to ``pack``; nothing is installed here.
Offer = Callable[[Any], Any]

# The fields of the exit reasons' payloads, checked both ways: a sender refuses to send what its
# receiver would refuse (closing the connection).
_CRASH_FIELDS = (_payloads.STR,) * 4  # type name, message, traceback, endpoint
_EXIT_FIELDS = (_payloads.INT, _payloads.STR)  # pid, how
_HUNG_FIELDS = (_payloads.STR, _payloads.NUMBER, _payloads.STR, _payloads.STR)


def _value_mesh_problem(data: list[Any]) -> str | None:
    return _payloads.mesh_shape_problem(data[0], len(data[1]))


def _value_mesh_from(data: Any) -> ValueMesh[Any]:
    shape, values = _payloads.fields(data, "value mesh", (_payloads.LIST, _payloads.LIST))
    return ValueMesh(_payloads.mesh_shape(shape, len(values), "value mesh"), values)


# The core's values that travel as extensions: code -> (type, to data, from data, why its data
# cannot travel or None). The codec sits above the core, so it knows them itself. Each "from
# data" checks its payload's type and arity before it builds anything (``_payloads.py``).
_CORE_EXTS: Mapping[
    int,
    tuple[type, Callable[[Any], Any], Callable[[Any], Any], Callable[[Any], str | None]],
] = MappingProxyType(
    {
        EXT_ACTOR_CRASH: (
            ActorCrash,
            lambda c: [c.type_name, c.message, c.traceback, c.endpoint],
            lambda d: ActorCrash(*_payloads.fields(d, "actor crash", _CRASH_FIELDS)),
            partial(_payloads.fields_problem, types=_CRASH_FIELDS),
        ),
        EXT_PROCESS_EXIT: (
            ProcessExit,
            lambda p: [p.pid, p.how],
            lambda d: ProcessExit(*_payloads.fields(d, "process exit", _EXIT_FIELDS)),
            partial(_payloads.fields_problem, types=_EXIT_FIELDS),
        ),
        EXT_HUNG: (
            Hung,
            lambda h: [h.endpoint, h.seconds, h.how, h.stacks],
            lambda d: Hung(*_payloads.fields(d, "hung", _HUNG_FIELDS)),
            partial(_payloads.fields_problem, types=_HUNG_FIELDS),
        ),
        EXT_VALUE_MESH: (
            ValueMesh,
            lambda vm: [list(vm.shape.items()), vm.values()],
            _value_mesh_from,
            _value_mesh_problem,
        ),
    }
)
_CORE_CODES: Mapping[type, int] = MappingProxyType({e[0]: c for c, e in _CORE_EXTS.items()})
# Values of the layers above (refs, meshes, buffers), by code. Each such class says how it
# travels (``_wire_ext``, ``_to_wire()``, ``_from_wire(data)``); the codec looks it up by name
# when it meets one, so it never imports the layers above it (they import the codec).
_UPPER_EXTS: Mapping[int, str] = MappingProxyType(
    {
        EXT_ACTOR_REF: "otpmesh._node._mesh:ActorRef",
        EXT_ACTOR_MESH: "otpmesh._node._mesh:ActorMesh",
        EXT_RDMA_BUFFER: "otpmesh.rdma._buffer:RDMABuffer",
    }
)


class PendingTensor:
    """A large value still in its sender's memory: ``handle`` says where (the receiving node's
    tensor channel reads it); ``form`` says what to rebuild (None: a torch tensor; else the
    form of a channel buffer, see the module docstring). Packed again (a host agent relaying a
    reply), it travels as it came."""

    __slots__ = ("form", "handle")

    def __init__(self, handle: Any, form: Any = None) -> None:
        self.handle = handle
        self.form = form


class _Packing:
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


class _Blob:
    """A bytes, bytearray or memoryview of CHANNEL_THRESHOLD bytes or more, wrapped by ``_lift``
    so that msgpack hands it to ``_default`` (which offers it to the channel)."""

    __slots__ = ("value",)

    def __init__(self, value: bytes | bytearray | memoryview) -> None:
        self.value = value


_PLAIN = _Packing(None, False)


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


def _encode_tensor(original: Any, level: int, how: _Packing) -> msgpack.ExtType:
    t = original
    if t.layout is not sys.modules["torch"].strided:
        raise EncodeError(f"cannot send a {t.layout} tensor; convert it with .to_dense() first")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    nbytes = t.numel() * t.element_size()
    if nbytes >= CHANNEL_THRESHOLD and how.offer is not None:
        handle = how.handle_for(original, t)
        if handle is not None:
            return msgpack.ExtType(EXT_CHANNEL_TENSOR, _pack(handle, level + 1, _PLAIN))
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
    return msgpack.ExtType(EXT_TENSOR, b"".join((_U16.pack(len(header)), header, raw)))


def _decode_tensor(data: bytes) -> Any:
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


def _encode_array(a: Any, level: int, how: _Packing) -> msgpack.ExtType:
    """A numpy array: inline (EXT_ARRAY) or, from CHANNEL_THRESHOLD bytes, over the channel."""
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
            form = ["ndarray", dt.str, shape]
            return msgpack.ExtType(EXT_CHANNEL_BUFFER, _pack([form, handle], level + 1, _PLAIN))
    if nbytes > MAX_FRAME_SIZE and not how.local:
        raise EncodeError(
            f"cannot send a numpy array of {nbytes} bytes inline: a frame carries at most "
            f"{MAX_FRAME_SIZE} bytes; send it from a running otpmesh node (large arrays go "
            "over the tensor channel)"
        )
    return msgpack.ExtType(EXT_ARRAY, inline_array(dt.str, shape, memoryview(flat)))


def _encode_blob(value: bytes | bytearray | memoryview, level: int, how: _Packing) -> Any:
    """A large bytes-like (wrapped by ``_lift``): over the channel, or inline as msgpack bin."""
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
        return bytes(value)  # what msgpack would have packed (bin)
    return msgpack.ExtType(EXT_CHANNEL_BUFFER, _pack([form, handle], level + 1, _PLAIN))


def _lift(obj: Any, levels: int) -> Any:
    """`obj` with every bytes-like of CHANNEL_THRESHOLD bytes or more in its lists, tuples,
    dicts and value meshes (`levels` deep) wrapped as a ``_Blob``; `obj` itself if none was."""
    if isinstance(obj, bytes | bytearray):
        return _Blob(obj) if len(obj) >= CHANNEL_THRESHOLD else obj
    if isinstance(obj, memoryview):
        return _Blob(obj) if obj.nbytes >= CHANNEL_THRESHOLD else obj
    if levels <= 0:
        return obj
    if isinstance(obj, list | tuple):
        items = [_lift(item, levels - 1) for item in obj]
        if all(new is old for new, old in zip(items, obj, strict=True)):
            return obj
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, dict):
        lifted = {key: _lift(value, levels - 1) for key, value in obj.items()}
        if all(lifted[key] is value for key, value in obj.items()):
            return obj
        return lifted
    if type(obj) is ValueMesh:
        values = obj.values()
        new = _lift(values, levels - 1)
        return obj if new is values else ValueMesh(dict(obj.shape.items()), new)
    return obj


def _too_deep() -> EncodeError:
    return EncodeError(
        f"cannot send a value nested more than {MAX_NESTING} levels deep in tuples, tensors, "
        "refs and other extension values (otpmesh._wire._codec.MAX_NESTING); flatten it, or nest "
        "lists instead of tuples"
    )


def _default(level: int, how: _Packing, obj: Any) -> Any:
    """msgpack's hook for what it cannot pack itself, inside `level` extension values."""
    if isinstance(obj, tuple):
        if level >= MAX_NESTING:
            raise _too_deep()
        return msgpack.ExtType(EXT_TUPLE, _pack(list(obj), level + 1, how))
    kind = type(obj)
    code = _CORE_CODES.get(kind)
    if code is None:
        code = getattr(kind, "_wire_ext", None)
    if code is not None:
        if level >= MAX_NESTING:
            raise _too_deep()
        core = _CORE_EXTS.get(code)
        if core is None:
            data = obj._to_wire()
        else:
            data = core[1](obj)
            problem = core[3](data)
            if problem is not None:
                raise EncodeError(
                    f"cannot send this {kind.__name__}: its wire form {problem} (build it with "
                    "the field types it declares, and a value mesh with one value per point)"
                )
        return msgpack.ExtType(code, _pack(data, level + 1, how))
    if kind is PendingTensor:  # relayed as it came: its reader fetches it from its owner
        if obj.form is None:
            return msgpack.ExtType(EXT_CHANNEL_TENSOR, _pack(obj.handle, level + 1, _PLAIN))
        return msgpack.ExtType(EXT_CHANNEL_BUFFER, _pack([obj.form, obj.handle], level + 1, _PLAIN))
    if kind is _Blob:
        if level >= MAX_NESTING:
            raise _too_deep()
        return _encode_blob(obj.value, level, how)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if level >= MAX_NESTING:
            raise _too_deep()
        return _encode_tensor(obj, level, how)
    numpy = sys.modules.get("numpy")  # never imported here: only a sender that has it has arrays
    if numpy is not None and isinstance(obj, numpy.ndarray):
        if level >= MAX_NESTING:
            raise _too_deep()
        return _encode_array(obj, level, how)
    # strict_types sends subclasses here (bool-like ints, enums, OrderedDict, ...): use the base.
    bases: tuple[Callable[[Any], Any], ...] = (bool, int, float, str, bytes, dict, list)
    for base in bases:
        if isinstance(obj, base):  # type: ignore[arg-type]
            return base(obj)
    if isinstance(obj, bytearray | memoryview):
        return bytes(obj)
    raise EncodeError(
        f"cannot send a value of type {type(obj).__module__}.{type(obj).__qualname__}: "
        "messages carry msgpack data, tuples, torch tensors, numpy arrays and actor refs (never "
        "pickle)"
    )


_FORM = (str, list)  # a channel buffer's form: "bytes", "bytearray" or [kind, item, shape]


def _check_form(form: str | list[Any]) -> None:
    """ProtocolError unless `form` is one a channel buffer may have (the module docstring); the
    channel checks its item type against the handle before it reads anything."""
    if type(form) is str:
        if form not in ("bytes", "bytearray"):
            raise ProtocolError(f"unknown channel buffer form {brief(form)}")
        return
    kind, _item, shape = _payloads.fields(
        form, "channel buffer form", (_payloads.STR, _payloads.STR, _payloads.LIST)
    )
    if kind not in ("memoryview", "ndarray"):
        raise ProtocolError(f"unknown channel buffer form {brief(form)}")
    problem = shape_problem(shape, kind)
    if problem is not None:
        raise ProtocolError(problem)


def _ext_hook(level: int, pending: list[PendingTensor], code: int, data: bytes) -> Any:
    """msgpack's hook for an extension value met inside `level` others; the channel tensors it
    meets are appended to `pending`, for the caller of ``unpack``."""
    if level >= MAX_NESTING:
        raise ProtocolError(
            f"extension values nested more than {MAX_NESTING} levels deep (code {code} at "
            f"level {level + 1})"
        )
    if code == EXT_TUPLE:
        items = _unpack(data, level + 1, pending)
        if type(items) is not list:
            raise ProtocolError(f"tuple payload is not an array: {brief(items)}")
        return tuple(items)
    if code == EXT_TENSOR:
        return _decode_tensor(data)
    if code == EXT_CHANNEL_TENSOR:
        handle = _unpack(data, level + 1, pending)
        if type(handle) is not dict:  # its fields are checked by the channel that reads it
            raise ProtocolError(f"channel tensor payload is not a handle map: {brief(handle)}")
        placeholder = PendingTensor(handle)
        pending.append(placeholder)
        return placeholder
    if code == EXT_ARRAY:
        return decode_array(data)
    if code == EXT_CHANNEL_BUFFER:
        form, handle = _payloads.fields(
            _unpack(data, level + 1, pending), "channel buffer", (_FORM, (dict,))
        )
        _check_form(form)
        placeholder = PendingTensor(handle, form)
        pending.append(placeholder)
        return placeholder
    core = _CORE_EXTS.get(code)
    if core is not None:
        return core[2](_unpack(data, level + 1, pending))
    where = _UPPER_EXTS.get(code)
    if where is None:
        raise ProtocolError(f"unknown extension type {code}")
    module, _, name = where.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls._from_wire(_unpack(data, level + 1, pending))


# The plain hooks for each level, made once: the depth travels in them, not in module state.
_DEFAULTS = tuple(partial(_default, level, _PLAIN) for level in range(MAX_NESTING + 1))


def _pack(obj: Any, level: int, how: _Packing) -> bytes:
    default = _DEFAULTS[level] if how is _PLAIN else partial(_default, level, how)
    try:
        return msgpack.packb(  # type: ignore[no-any-return]
            obj, default=default, strict_types=True, use_bin_type=True
        )
    except EncodeError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # "recursion limit exceeded", ...
        raise EncodeError(f"cannot encode message: {exc}") from exc
    except RecursionError as exc:
        raise EncodeError(f"cannot encode message: nested too deeply ({exc})") from exc


def _unpack(data: bytes, level: int, pending: list[PendingTensor]) -> Any:
    hook = partial(_ext_hook, level, pending)
    return msgpack.unpackb(data, ext_hook=hook, raw=False, strict_map_key=False)


def _too_big(size: int, exact: bool) -> EncodeError:
    what = f"{size} bytes" if exact else f"more than {size} bytes"
    return EncodeError(
        f"cannot send a message of {what}: a frame carries at most {MAX_FRAME_SIZE} bytes; "
        "send large data as a torch tensor (large tensors go over the tensor channel) or as an "
        "otpmesh.rdma.RDMABuffer"
    )


def _blob_bytes(obj: Any, levels: int) -> int:
    """A cheap lower bound of obj's encoded size: the bytes and strings in its top `levels`
    levels of containers (exact types only; the check after packing catches what this misses)."""
    kind = type(obj)
    if kind is bytes or kind is str or kind is bytearray:
        return len(obj)
    if kind is memoryview:
        return int(obj.nbytes)
    items: Collection[Any]
    if kind is list or kind is tuple:
        items = obj
    elif kind is dict:
        items = obj.values()
    else:
        return 0
    if len(items) > _SCAN_ITEMS:
        return 0
    total = 0
    for item in items:
        kind = type(item)
        if kind is bytes or kind is str or kind is bytearray:
            total += len(item)
        elif levels > 1 and (kind is list or kind is tuple or kind is dict or kind is memoryview):
            total += _blob_bytes(item, levels - 1)
    return total


def pack(obj: Any, offer: Offer | None = None, *, local: bool = False) -> bytes:
    """Encode one value (a whole message or a part of one); EncodeError if it cannot travel.

    `offer`: the sending node's tensor channel, for tensors of CHANNEL_THRESHOLD bytes or more
    (without one they travel inline). `local`: the receiver is in this process (no channel, and
    no frame to fit in)."""
    how = _PLAIN if offer is None and not local else _Packing(None if local else offer, local)
    if local:
        return _pack(obj, 0, how)
    blobs = _blob_bytes(obj, _SCAN_LEVELS)
    if how.offer is not None:
        if blobs >= CHANNEL_THRESHOLD:  # large bytes-likes near the top: to the channel
            obj = _lift(obj, _LIFT_LEVELS)
            blobs = _blob_bytes(obj, _SCAN_LEVELS)
        else:  # maybe deeper: the packed size says (then pack again, offering nothing twice)
            how.offered = {}
    if blobs > MAX_FRAME_SIZE:
        raise _too_big(blobs, exact=False)
    packed = _pack(obj, 0, how)
    if how.offered is not None and len(packed) >= CHANNEL_THRESHOLD:
        lifted = _lift(obj, _LIFT_LEVELS)
        if lifted is not obj:
            how.replays, how.offered = how.offered, None
            packed = _pack(lifted, 0, how)
    if len(packed) > MAX_FRAME_SIZE:
        raise _too_big(len(packed), exact=True)
    return packed


def unpack_pending(data: bytes) -> tuple[Any, list[PendingTensor]]:
    """Decode one frame payload, and hand back the channel tensors in it: placeholders, still in
    their senders' memory, for the caller to fetch (a node's tensor channel does). Any
    malformation is a ProtocolError."""
    pending: list[PendingTensor] = []
    try:
        return _unpack(data, 0, pending), pending
    except ProtocolError:
        raise
    except Exception as exc:
        if isinstance(exc, msgpack.StackError):
            why = "arrays and maps nested deeper than msgpack's limit of 1024"
        else:
            why = f"{type(exc).__name__}: {exc}"
        raise ProtocolError(f"malformed frame ({why})") from exc


def unpack(data: bytes) -> Any:
    """Decode one value (channel tensors in it stay ``PendingTensor`` placeholders)."""
    return unpack_pending(data)[0]
