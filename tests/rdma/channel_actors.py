"""Actors the tensor-channel semantics tests spawn (importable by workers)."""

from __future__ import annotations

import gc
import os
from typing import Any

import otpmesh


def memfd_leftovers(pid: int) -> dict[str, int]:
    """Mappings and descriptors of channel snapshots (memory files) that process `pid` holds."""
    with open(f"/proc/{pid}/maps") as f:
        maps = sum("otpmesh-channel" in line for line in f)
    fds = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds += "otpmesh-channel" in os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
    return {"maps": maps, "fds": fds}


class Keeper(otpmesh.Actor):
    """Keeps the tensors it is sent; answers questions about them."""

    def __init__(self) -> None:
        self.kept: dict[str, Any] = {}

    @otpmesh.endpoint
    def keep(self, key: str, t: Any) -> int:
        self.kept[key] = t
        return os.getpid()

    @otpmesh.endpoint
    def get(self, key: str) -> Any:
        return self.kept[key]

    @otpmesh.endpoint
    def add(self, key: str, value: float) -> None:
        self.kept[key].add_(value)

    @otpmesh.endpoint
    def equals(self, key: str, expected: Any) -> bool:
        """Bit for bit (NaNs included), dtype and shape."""
        import torch

        got = self.kept[key]
        return (
            got.dtype == expected.dtype
            and got.shape == expected.shape
            and bool(torch.equal(got.view(torch.uint8), expected.view(torch.uint8)))
        )

    @otpmesh.endpoint
    def mapped(self, key: str) -> bool:
        """Whether the kept tensor lies in a mapped channel snapshot (not a copy)."""
        address = self.kept[key].data_ptr()
        with open("/proc/self/maps") as f:
            for line in f:
                if "otpmesh-channel" in line:
                    start, end = (int(x, 16) for x in line.split()[0].split("-"))
                    if start <= address < end:
                        return True
        return False

    @otpmesh.endpoint
    def forget(self) -> None:
        self.kept.clear()
        gc.collect()

    @otpmesh.endpoint
    async def send_to(self, peer: Any, key: str, t: Any) -> int:
        """Pass `t` on to `peer` (actor to actor); keep it too."""
        self.kept[key] = t
        return int(await peer.keep(key, t))

    @otpmesh.endpoint
    async def hold(self, t: Any) -> None:
        import trio

        self.kept["held"] = t
        await trio.sleep_forever()

    @otpmesh.endpoint
    async def read(self, buf: Any) -> Any:
        import torch

        dst = torch.empty(buf.nbytes // 4, dtype=torch.float32)
        await buf.read_into(dst)
        return dst

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()
