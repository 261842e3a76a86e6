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
   16  port        msgpack [owner address, port id, token]: where a Port's values go

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

Tensors, numpy arrays and large bytes-likes, inline or over the tensor channel, are
``_tensors.py``'s.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any

import msgpack

from .._core._errors import EncodeError, ProtocolError
from . import _corevalues
from ._arrays import MAX_DIMS, decode_array
from ._brief import brief
from ._corevalues import CoreValue
from ._framesize import SCAN_LEVELS, blob_bytes, too_big
from ._framing import MAX_FRAME_SIZE
from ._packers import KEEP_PACKER_BELOW, Packer, ThreadPackers
from ._tensors import (
    AUTOGRAD_FLAGS,
    CHANNEL_THRESHOLD,
    PLAIN,
    Blob,
    Channelled,
    Offer,
    Packing,
    PendingTensor,
    autograd_flag,
    decode_tensor,
    encode_array,
    encode_blob,
    encode_tensor,
    lift,
    pending_buffer,
    with_autograd,
)

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
EXT_PROC_MESH = 13
EXT_MESH_FAILURE = 14
EXT_AUTOGRAD = 15
EXT_PORT = 16

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
# How deep in lists, tuples and dicts a large bytes-like is found for the channel (deeper ones
# travel inline): a bound on the walk's recursion.
_LIFT_LEVELS = 32

# The core's values that travel as extensions, by code (_corevalues.py).
_CORE_EXTS: Mapping[int, CoreValue] = MappingProxyType(
    {
        EXT_ACTOR_CRASH: _corevalues.ACTOR_CRASH,
        EXT_PROCESS_EXIT: _corevalues.PROCESS_EXIT,
        EXT_HUNG: _corevalues.HUNG,
        EXT_VALUE_MESH: _corevalues.VALUE_MESH,
    }
)
_CORE_CODES: Mapping[type, int] = MappingProxyType({e.kind: c for c, e in _CORE_EXTS.items()})
# Values of the layers above (refs, meshes, buffers), by code. Each such class says how it
# travels (``_wire_ext``, ``_to_wire()``, ``_from_wire(data)``); the codec looks it up by name
# when it meets one, so it never imports the layers above it (they import the codec).
_UPPER_EXTS: Mapping[int, str] = MappingProxyType(
    {
        EXT_ACTOR_REF: "otpmesh._node._mesh:ActorRef",
        EXT_ACTOR_MESH: "otpmesh._node._mesh:ActorMesh",
        EXT_RDMA_BUFFER: "otpmesh.rdma._buffer:RDMABuffer",
        EXT_PROC_MESH: "otpmesh._controller._procref:ProcMeshRef",
        EXT_MESH_FAILURE: "otpmesh._node._failure:MeshFailure",
        EXT_PORT: "otpmesh._node._ports:Port",
    }
)


def _too_deep() -> EncodeError:
    return EncodeError(
        f"cannot send a value nested more than {MAX_NESTING} levels deep in tuples, tensors, "
        "refs and other extension values (otpmesh._wire._codec.MAX_NESTING); flatten it, or nest "
        "lists instead of tuples"
    )


def _default(level: int, how: Packing, obj: Any) -> Any:
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
            data = core.to_data(obj)
            problem = core.problem(data)
            if problem is not None:
                raise EncodeError(
                    f"cannot send this {kind.__name__}: its wire form {problem} (build it with "
                    "the field types it declares, and a value mesh with one value per point)"
                )
        return msgpack.ExtType(code, _pack(data, level + 1, how))
    if kind is PendingTensor:  # relayed as it came: its reader fetches it from its owner
        if obj.form is None and obj.autograd is not None:
            channelled = _channelled(EXT_CHANNEL_TENSOR, obj.handle, level + 1)
            return _autograd(obj.autograd, channelled, level)
        if obj.form is None:
            return _channelled(EXT_CHANNEL_TENSOR, obj.handle, level)
        return _channelled(EXT_CHANNEL_BUFFER, [obj.form, obj.handle], level)
    if kind is Blob:
        if level >= MAX_NESTING:
            raise _too_deep()
        blob = encode_blob(obj.value, how)
        if isinstance(blob, Channelled):
            return _channelled(EXT_CHANNEL_BUFFER, blob.data, level)
        return blob  # what msgpack would have packed (bin)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if level >= MAX_NESTING:
            raise _too_deep()
        flag = autograd_flag(obj)
        inner = level if flag is None else level + 1
        tensor = encode_tensor(obj, how)
        if isinstance(tensor, Channelled):
            value = _channelled(EXT_CHANNEL_TENSOR, tensor.data, inner)
        else:
            value = msgpack.ExtType(EXT_TENSOR, tensor)
        return value if flag is None else _autograd(flag, value, level)
    numpy = sys.modules.get("numpy")  # never imported here: only a sender that has it has arrays
    if numpy is not None and isinstance(obj, numpy.ndarray):
        if level >= MAX_NESTING:
            raise _too_deep()
        array = encode_array(obj, how)
        if isinstance(array, Channelled):
            return _channelled(EXT_CHANNEL_BUFFER, array.data, level)
        return msgpack.ExtType(EXT_ARRAY, array)
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


def _autograd(flag: str, tensor: msgpack.ExtType, level: int) -> msgpack.ExtType:
    """A tensor's extension value wrapped with its autograd flag (AUTOGRAD_FLAGS)."""
    if level + 1 >= MAX_NESTING:
        raise _too_deep()
    return msgpack.ExtType(EXT_AUTOGRAD, _pack([flag, tensor], level + 1, PLAIN))


def _channelled(code: int, data: Any, level: int) -> msgpack.ExtType:
    """The extension value of a value left in its sender's memory (its handle is plain data)."""
    return msgpack.ExtType(code, _pack(data, level + 1, PLAIN))


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
        return decode_tensor(data)
    if code == EXT_CHANNEL_TENSOR:
        handle = _unpack(data, level + 1, pending)
        if type(handle) is not dict:  # its fields are checked by the channel that reads it
            raise ProtocolError(f"channel tensor payload is not a handle map: {brief(handle)}")
        placeholder = PendingTensor(handle)
        pending.append(placeholder)
        return placeholder
    if code == EXT_AUTOGRAD:
        wrapped = _unpack(data, level + 1, pending)
        if type(wrapped) is not list or len(wrapped) != 2:
            raise ProtocolError(f"malformed autograd tensor payload: {brief(wrapped)}")
        flag, tensor = wrapped
        if type(flag) is not str or flag not in AUTOGRAD_FLAGS:
            raise ProtocolError(f"unknown autograd flag {brief(flag)}")
        if isinstance(tensor, PendingTensor) and tensor.form is None:
            tensor.autograd = flag  # applied by the channel once it has read the values
            return tensor
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(tensor, torch.Tensor):
            raise ProtocolError(f"an autograd flag around a {type(tensor).__name__}, not a tensor")
        return with_autograd(tensor, flag)
    if code == EXT_ARRAY:
        return decode_array(data)
    if code == EXT_CHANNEL_BUFFER:
        placeholder = pending_buffer(_unpack(data, level + 1, pending))
        pending.append(placeholder)
        return placeholder
    core = _CORE_EXTS.get(code)
    if core is not None:
        return core.from_data(_unpack(data, level + 1, pending))
    where = _UPPER_EXTS.get(code)
    if where is None:
        raise ProtocolError(f"unknown extension type {code}")
    module, _, name = where.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls._from_wire(_unpack(data, level + 1, pending))


def _hook(packer: Packer, obj: Any) -> Any:
    return _default(packer.level, packer.how, obj)


_PACKERS = ThreadPackers(MAX_NESTING, _hook)


def _pack(obj: Any, level: int, how: Packing) -> bytes:
    packers = _PACKERS.by_level
    packer = packers[level]
    if packer.busy:  # re-entered (a hook packing at its own level): never share its buffer
        packer = Packer(level, _hook)
    packer.busy, packer.how = True, how
    try:
        packed: bytes = packer.pack(obj)  # on an error, msgpack empties its buffer
    except EncodeError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # "recursion limit exceeded", ...
        raise EncodeError(f"cannot encode message: {exc}") from exc
    except RecursionError as exc:
        raise EncodeError(f"cannot encode message: nested too deeply ({exc})") from exc
    finally:
        packer.busy, packer.how = False, PLAIN  # let go of this call's offer and handles
    if len(packed) >= KEEP_PACKER_BELOW and packers[level] is packer:
        packers[level] = Packer(level, _hook)
    return packed


def _unpack(data: bytes, level: int, pending: list[PendingTensor]) -> Any:
    hook = partial(_ext_hook, level, pending)
    return msgpack.unpackb(data, ext_hook=hook, raw=False, strict_map_key=False)


#: Values with nothing in them for the tensor channel to take: a message of these alone is
#: packed without an offer (no bookkeeping of what was offered; the hot path's echo(i)).
SCALARS = frozenset({int, float, bool, type(None)})


def pack(obj: Any, offer: Offer | None = None, *, local: bool = False) -> bytes:
    """Encode one value (a whole message or a part of one); EncodeError if it cannot travel.

    `offer`: the sending node's tensor channel, for tensors of CHANNEL_THRESHOLD bytes or more
    (without one they travel inline). `local`: the receiver is in this process (no channel, and
    no frame to fit in)."""
    how = PLAIN if offer is None and not local else Packing(None if local else offer, local)
    if local:
        return _pack(obj, 0, how)
    blobs = blob_bytes(obj, SCAN_LEVELS)
    if how.offer is not None:
        if blobs >= CHANNEL_THRESHOLD:  # large bytes-likes near the top: to the channel
            obj = lift(obj, _LIFT_LEVELS)
            blobs = blob_bytes(obj, SCAN_LEVELS)
        else:  # maybe deeper: the packed size says (then pack again, offering nothing twice)
            how.offered = {}
    if blobs > MAX_FRAME_SIZE:
        raise too_big(blobs, exact=False)
    packed = _pack(obj, 0, how)
    if how.offered is not None and len(packed) >= CHANNEL_THRESHOLD:
        lifted = lift(obj, _LIFT_LEVELS)
        if lifted is not obj:
            how.replays, how.offered = how.offered, None
            packed = _pack(lifted, 0, how)
    if len(packed) > MAX_FRAME_SIZE:
        raise too_big(len(packed), exact=True)
    return packed


def pack_plain(obj: Any) -> bytes:
    """``pack`` for a value with nothing the tensor channel could take (numbers, None): no
    offer and no scan ahead of packing, only the size check (the hot path's call and reply)."""
    packed = _pack(obj, 0, PLAIN)
    if len(packed) > MAX_FRAME_SIZE:
        raise too_big(len(packed), exact=True)
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
