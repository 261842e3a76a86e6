"""What a message costs in a frame: the cheap scan of its size before it is packed
(``blob_bytes``), and the error for one past the frame's limit (``too_big``)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from .._core._errors import EncodeError
from ._framing import MAX_FRAME_SIZE

# The cheap size check before packing looks this many containers deep (a call's [method, args,
# kwargs], its arguments, their items), into containers of at most this many items: a bound on
# its cost on the hot path. The size after packing is checked too, for what this misses.
SCAN_LEVELS = 3
SCAN_ITEMS = 32


def too_big(size: int, exact: bool) -> EncodeError:
    what = f"{size} bytes" if exact else f"more than {size} bytes"
    return EncodeError(
        f"cannot send a message of {what}: a frame carries at most {MAX_FRAME_SIZE} bytes; "
        "send large data as a torch tensor (large tensors go over the tensor channel) or as an "
        "otpmesh.rdma.RDMABuffer"
    )


def blob_bytes(obj: Any, levels: int) -> int:
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
    if len(items) > SCAN_ITEMS:
        return 0
    total = 0
    for item in items:
        kind = type(item)
        if kind is bytes or kind is str or kind is bytearray:
            total += len(item)
        elif levels > 1 and (kind is list or kind is tuple or kind is dict or kind is memoryview):
            total += blob_bytes(item, levels - 1)
    return total
