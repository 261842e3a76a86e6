"""Actors the GPU checks spawn (importable by workers)."""

from __future__ import annotations

from typing import Any

import otpmesh


class CudaKeeper(otpmesh.Actor):
    """Keeps the tensors it is sent; says where they are and what they hold."""

    def __init__(self) -> None:
        self.kept: dict[str, Any] = {}

    @otpmesh.endpoint
    def keep(self, key: str, t: Any) -> str:
        self.kept[key] = t
        return str(t.device)

    @otpmesh.endpoint
    def digest(self, key: str) -> bytes:
        """The kept tensor's bytes, copied to the CPU here (to compare bit for bit)."""
        import torch

        t = self.kept[key]
        return bytes(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())

    @otpmesh.endpoint
    def make(self, numel: int, seed: int) -> Any:
        """A CUDA tensor of random bits, made here and returned (a result)."""
        import torch

        g = torch.Generator(device="cuda").manual_seed(seed)
        return torch.randn(numel, device="cuda", generator=g)

    @otpmesh.endpoint
    def register(self, numel: int) -> Any:
        import torch

        from otpmesh.rdma import RDMABuffer

        self.kept["registered"] = torch.arange(numel, dtype=torch.float32, device="cuda")
        return RDMABuffer(self.kept["registered"])
