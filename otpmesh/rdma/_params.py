"""Loading weights straight into a module's parameters: make them views into one flat tensor,
then read the owner's buffer into that tensor."""

from __future__ import annotations

from typing import Any


def flat_parameters(module: Any) -> Any:
    """Rebind `module`'s parameters as views into one new contiguous tensor and return it.

    The layout is ``torch.nn.utils.parameters_to_vector(module.parameters())``'s: parameters in
    ``parameters()`` order, each flattened. After this, ``await buf.read_into(flat)`` loads a
    learner's flat weights into the module in place, with no intermediate tensor and no
    ``vector_to_parameters`` copy. The parameters keep their values, and stay the same
    ``Parameter`` objects (only their data is rebound), so an optimizer made before this call
    steps the views too; on a learner the flat tensor registered once is then its current
    weights after every step, with nothing to copy."""
    import torch

    params = list(module.parameters())
    if not params:
        raise ValueError(f"{type(module).__name__} has no parameters to flatten")
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) > 1:
        found = sorted(map(str, kinds))
        raise ValueError(f"flat_parameters needs one dtype and device for all parameters: {found}")
    flat = torch.empty(
        sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device
    )
    offset = 0
    with torch.no_grad():
        for param in params:
            view = flat[offset : offset + param.numel()].view_as(param)
            view.copy_(param)
            param.data = view
            offset += param.numel()
    return flat
