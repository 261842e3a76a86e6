"""A local tensor or writable buffer as the tensor channel sees it: its memory (a ``Region``),
with its dtype and shape (tensors only); what cannot be registered or filled is refused here."""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from ._backend import Region
from ._error import RDMAError


def _torch() -> Any:
    return sys.modules.get("torch")


def describe_target(obj: Any) -> tuple[Region, str | None, list[int] | None]:
    """The memory of a tensor or writable buffer, with its dtype and shape (tensors only)."""
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type == "cuda":
            raise RDMAError(
                "a cuda tensor needs the cuda_ipc backend, which this build does not provide "
                "yet; register a CPU copy (tensor.cpu()) instead"
            )
        if obj.device.type != "cpu":
            raise RDMAError(
                f"a {obj.device.type} tensor: RDMABuffer takes CPU tensors; register "
                "tensor.cpu() instead"
            )
        if not obj.is_contiguous():
            raise RDMAError("RDMABuffer needs a contiguous tensor: call .contiguous() first")
        nbytes = obj.numel() * obj.element_size()
        return (
            Region(obj.data_ptr(), nbytes),
            str(obj.dtype).removeprefix("torch."),
            list(obj.shape),
        )
    try:
        view = memoryview(obj).cast("B")
    except TypeError:
        raise RDMAError(
            f"cannot register a {type(obj).__name__}: give a CPU tensor or a "
            "writable buffer (bytearray, numpy array, mmap)"
        ) from None
    if view.readonly:
        raise RDMAError(f"cannot register a read-only {type(obj).__name__}: it must be writable")
    address = ctypes.addressof(ctypes.c_char.from_buffer(view)) if len(view) else 0
    return Region(address, len(view)), None, None
