"""numpy arrays on the wire: which dtypes travel (as raw bytes), and the inline form.

An inline array (extension 10) is a u16 header length, a msgpack header ``[dtype str, shape]``
and the raw bytes in C order. The same dtype and shape checks serve the channel form
(extension 11), whose header the tensor channel reads, and torch tensors (extension 1).

A shape is bounded by its bytes: a value with elements has as many as its bytes say, so no dim
exceeds them. A zero-element value carries no bytes at all, so its shape is bounded here
instead: the rows before its first zero dim (what ``for row in value`` or ``tolist()`` walk,
one new object each) by MAX_EMPTY_ROWS, and the product of its nonzero dims (what strides are
computed from) by MAX_EMPTY_EXTENT. ``[0, 3, 1024, 1024]`` (an empty batch of images) travels;
``[2**31, 0]`` (27 bytes that once made a decoder walk 2**31 rows) does not.

numpy is imported only when an array arrives: a sender meets arrays only if it imported numpy
itself.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import msgpack

from .._core._errors import EncodeError, ProtocolError
from ._brief import brief

#: Most dimensions an array, a tensor or a view on the wire may have.
MAX_DIMS = 64
#: Most rows a zero-element value may have before its first zero dim (see the docstring).
MAX_EMPTY_ROWS = 1 << 16
#: Largest product of a zero-element value's nonzero dims: a frame's size (MAX_FRAME_SIZE).
MAX_EMPTY_EXTENT = 1 << 30
#: memoryview formats a receiver can make again (``memoryview.cast``): single native items.
#: A view of any other format, or with a zero in its shape, arrives as flat bytes ('B').
VIEW_FORMATS = frozenset("bBhHiIlLqQnNfde?c")
# numpy dtypes that travel: one kind, byte order and size (``dtype.str``), no objects or fields.
_ARRAY_DTYPE = re.compile(r"[<>|][biufcmMSUV][0-9]{1,9}(\[[0-9]{0,9}[A-Za-z]{1,2}\])?")
_U16 = struct.Struct(">H")


def check_sendable(dt: Any) -> None:
    """EncodeError unless numpy dtype `dt` travels as raw bytes."""
    if (
        dt.hasobject
        or dt.fields is not None
        or not dt.itemsize
        or not _ARRAY_DTYPE.fullmatch(dt.str)
    ):
        raise EncodeError(
            f"cannot send a numpy array of dtype {dt!r}: arrays travel as raw bytes, so only "
            "plain numeric, bool, datetime, bytes and str dtypes do (no objects, no fields); "
            "send its fields as separate arrays"
        )


def inline(dtype: str, shape: list[int], raw: memoryview) -> bytes:
    """The EXT_ARRAY payload of an array's C-order bytes."""
    header = msgpack.packb([dtype, shape])
    return b"".join((_U16.pack(len(header)), header, raw))


def array_dtype(name: Any) -> Any:
    """The numpy dtype an array's header names; ProtocolError unless it is one that travels."""
    if not isinstance(name, str) or not _ARRAY_DTYPE.fullmatch(name):
        raise ProtocolError(f"unknown array dtype {brief(name)}")
    import numpy

    try:
        dt = numpy.dtype(name)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"unknown array dtype {brief(name)}: {exc}") from None
    if dt.hasobject or dt.fields is not None or not dt.itemsize or dt.str != name:
        raise ProtocolError(f"array dtype {brief(name)} does not travel as raw bytes")
    return dt


def shape_problem(shape: Any, kind: str = "array") -> str | None:
    """Why `shape` is not the shape of a `kind` that may travel, or None (see the module
    docstring for the bounds on zero-element ones)."""
    if type(shape) is not list:
        return f"{kind} shape {brief(shape)} is not a list of sizes"
    if len(shape) > MAX_DIMS:
        return f"{kind} of {len(shape)} dims (at most {MAX_DIMS})"
    numel = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:
            return f"{kind} shape {brief(shape)} has a dim that is not a size"
        numel *= dim
    if numel:
        return None
    rows = extent = 1
    walking = True
    for dim in shape:
        walking = walking and dim != 0
        if dim:
            extent *= dim
            rows = rows * dim if walking else rows
    if rows > MAX_EMPTY_ROWS:
        return (
            f"{kind} shape {brief(shape)} has no elements but {rows} rows before its first zero "
            f"dim (at most {MAX_EMPTY_ROWS})"
        )
    if extent > MAX_EMPTY_EXTENT:
        return (
            f"{kind} shape {brief(shape)} has no elements but nonzero dims of product {extent} "
            f"(at most {MAX_EMPTY_EXTENT})"
        )
    return None


def array_numel(shape: Any, kind: str = "array") -> int:
    """The number of items of an array, tensor or view `shape` from the wire; ProtocolError if
    it is not a shape that travels (``shape_problem``)."""
    problem = shape_problem(shape, kind)
    if problem is not None:
        raise ProtocolError(problem)
    numel = 1
    for dim in shape:
        numel *= dim
    return numel


def split_header(data: bytes, kind: str) -> tuple[Any, memoryview]:
    """The ``[dtype, shape]`` header and the raw bytes of a tensor's or an array's payload (a
    u16 header length, the msgpack header, the bytes); ProtocolError if it is malformed."""
    if len(data) < 2:
        raise ProtocolError(f"malformed frame: a {len(data)}-byte {kind} payload has no header")
    (hlen,) = _U16.unpack_from(data, 0)
    if 2 + hlen > len(data):
        raise ProtocolError(f"{kind} header of {hlen} bytes overruns its {len(data)}-byte payload")
    header = msgpack.unpackb(data[2 : 2 + hlen])
    if not (isinstance(header, list) and len(header) == 2 and isinstance(header[1], list)):
        raise ProtocolError(f"{kind} header is not [dtype name, shape]: {brief(header)}")
    return header, memoryview(data)[2 + hlen :]


def decode_array(data: bytes) -> Any:
    """The numpy array of an EXT_ARRAY payload; ProtocolError if it is malformed."""
    header, body = split_header(data, "array")
    dt = array_dtype(header[0])
    numel = array_numel(header[1])
    if len(body) != numel * dt.itemsize:
        raise ProtocolError(
            f"array of shape {brief(header[1])} and dtype {header[0]} needs "
            f"{numel * dt.itemsize} bytes, frame has {len(body)}"
        )
    import numpy

    return numpy.frombuffer(bytearray(body), dtype=numpy.uint8).view(dt).reshape(header[1])
