"""Actors the tensor-channel semantics tests spawn (importable by workers)."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import AsyncIterator
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


@contextlib.asynccontextmanager
async def serving_channel(name: str) -> AsyncIterator[Any]:
    """A node of this process, serving, with a tensor channel: yields the channel."""
    import trio

    from otpmesh._node._node import Node
    from otpmesh.rdma._channel import Channel

    node = Node(name, channel=Channel)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.serve)
        assert isinstance(node.channel, Channel)
        yield node.channel
        nursery.cancel_scope.cancel()


async def settle_and_trim() -> dict[str, Any]:
    """In this process: wait until its channel holds no buffer and no reader maps one of its
    files; then say what it holds (``memfd_leftovers``, ``before`` and ``after`` closing its
    pool's free files) and its pool's counts."""
    import trio

    from otpmesh._node._node import current_node

    node = current_node()
    registry = None if node is None else node.channel._registry  # type: ignore[union-attr]
    if registry is None:
        nothing = memfd_leftovers(os.getpid())
        return {"before": nothing, "after": nothing, "pooled": 0, "reused": 0}
    with trio.fail_after(30):
        while (stats := registry.statistics()).buffers or stats.mapped:
            await registry.wait_changed()
    before = memfd_leftovers(os.getpid())
    registry.pool.trim()
    return {
        "before": before,
        "after": memfd_leftovers(os.getpid()),
        "pooled": stats.pooled,
        "reused": stats.reused,
    }


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
        return _in_channel_mapping(address)

    @otpmesh.endpoint
    def holds(self, t: Any, value: float) -> bool:
        """Whether every element of `t` (an argument, dropped after the call) is `value`."""
        return bool((t == value).all())

    @otpmesh.endpoint
    async def settle_and_trim(self) -> dict[str, Any]:
        return await settle_and_trim()

    @otpmesh.endpoint
    def channel_statistics(self) -> dict[str, int]:
        import dataclasses

        from otpmesh._node._node import current_node

        node = current_node()
        assert node is not None
        return dataclasses.asdict(node.channel.registry.statistics())  # type: ignore[union-attr]

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


class BufferKeeper(otpmesh.Actor):
    """Keeps bytes-likes and numpy arrays it is sent; says what they are and changes them."""

    def __init__(self) -> None:
        self.kept: dict[str, Any] = {}
        self.casts = 0

    @otpmesh.endpoint
    def keep(self, key: str, value: Any) -> None:
        self.kept[key] = value

    @otpmesh.endpoint
    def take(self, key: str, value: Any) -> None:
        """A cast's target: keeps the value and counts the casts."""
        self.kept[key] = value
        self.casts += 1

    @otpmesh.endpoint
    def count(self) -> int:
        return self.casts

    @otpmesh.endpoint
    def get(self, key: str) -> Any:
        return self.kept[key]

    @otpmesh.endpoint
    def describe(self, key: str) -> dict[str, Any]:
        """Type, bytes and, where they apply, writability, format, dtype and shape."""
        value = self.kept[key]
        kind = type(value).__name__
        info: dict[str, Any] = {"type": kind}
        if kind == "ndarray":
            info.update(
                dtype=value.dtype.str,
                shape=list(value.shape),
                writable=bool(value.flags.writeable),
                raw=value.tobytes(),
            )
        elif kind == "memoryview":
            info.update(
                format=value.format,
                shape=list(value.shape),
                writable=not value.readonly,
                raw=value.tobytes(),
            )
        else:
            info.update(raw=bytes(value), writable=kind == "bytearray")
        return info

    @otpmesh.endpoint
    def scribble(self, key: str) -> None:
        """Write to the kept value in place (its first and last byte)."""
        value = self.kept[key]
        view = memoryview(value).cast("B") if type(value).__name__ != "ndarray" else None
        if view is None:
            flat = value.reshape(-1).view("u1")
            flat[0] ^= 0xFF
            flat[-1] ^= 0xFF
        else:
            view[0] ^= 0xFF
            view[-1] ^= 0xFF

    @otpmesh.endpoint
    def mapped(self, key: str) -> bool:
        """Whether the kept value lies in a mapped channel snapshot (not a copy)."""
        value = self.kept[key]
        import ctypes

        if type(value).__name__ == "ndarray":
            address = value.ctypes.data
        else:
            view = memoryview(value).cast("B")
            address = ctypes.addressof(ctypes.c_char.from_buffer(view))
        return _in_channel_mapping(address)

    @otpmesh.endpoint
    def offer_one(self, nbytes: int) -> Any:
        """A value offered on this node's channel as a message would offer it, handed out as
        an RDMABuffer (a receiver never sees one; a test does, to try writing to it)."""
        from otpmesh._node._node import current_node
        from otpmesh.rdma import RDMABuffer

        node = current_node()
        assert node is not None and node.channel is not None
        self.kept["offered"] = bytearray(range(256)) * (nbytes // 256)
        handle = node.channel.offer(memoryview(self.kept["offered"]), None)
        return RDMABuffer._from_wire(handle)

    @otpmesh.endpoint
    async def write_into(self, buf: Any, nbytes: int) -> str:
        """Try to write zeros into `buf`: what the channel said (an actor that raises is gone)."""
        from otpmesh.rdma import RDMAError

        try:
            await buf.write_from(bytearray(nbytes))
        except RDMAError as exc:
            return f"RDMAError: {exc}"
        return "written"

    @otpmesh.endpoint
    async def read_from(self, buf: Any) -> bytes:
        dst = bytearray(buf.nbytes)
        await buf.read_into(dst)
        return bytes(dst[:64])

    @otpmesh.endpoint
    def channel_statistics(self) -> dict[str, int]:
        from otpmesh._node._node import current_node

        node = current_node()
        registry = None if node is None else node.channel._registry  # type: ignore[union-attr]
        if registry is None:
            return {"buffers": 0, "snapshots": 0}
        stats = registry.statistics()
        return {"buffers": stats.buffers, "snapshots": stats.snapshots}


def _in_channel_mapping(address: int) -> bool:
    """Whether `address` lies in a mapped channel snapshot of this process (not a copy)."""
    with open("/proc/self/maps") as f:
        for line in f:
            if "otpmesh-channel" in line:
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                if start <= address < end:
                    return True
    return False
