"""Temporary buffers (large values of messages) do not pile up: a cast's go once every target has
read them, and anything left goes at its deadline, by the registry's own timer (trio's clock),
not at the next offer."""

from __future__ import annotations

import os

import pytest
import torch
import trio
import trio.testing

import otpmesh
from otpmesh._node._node import current_node
from otpmesh.rdma._channel import MAP_ABOVE, TEMP_TTL
from otpmesh.rdma._pool import IDLE
from tests.conftest import run_trio
from tests.rdma.channel_actors import (
    BufferKeeper,
    memfd_leftovers,
    serving_channel,
    settle_and_trim,
)

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _workers_touch_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTPMESH_PRELOAD", raising=False)
    monkeypatch.delenv("OTPMESH_RDMA_BACKENDS", raising=False)


def test_repeated_large_casts_are_released_once_every_target_has_read_them() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            keepers = await procs.spawn("k", BufferKeeper)
            for i in range(4):  # copied (2 MiB) and mapped (MAP_ABOVE) values, bytes and tensors
                await keepers.take.broadcast(f"t{i}", torch.full((MIB // 2,), float(i)))
                await keepers.take.broadcast(f"b{i}", bytearray([i]) * MAP_ABOVE)
            # Casts are FIFO with later calls: by these replies every target has fetched all.
            assert (await keepers.count()).values() == [8, 8]
            registry = current_node().channel.registry  # type: ignore[union-attr]
            # Each target's unpins and unmaps come on a connection of their own: wait for them
            # (settle_and_trim does), not a time. What is left is the pool's free files only.
            left = await settle_and_trim()
            assert registry.statistics().expiring == 0
            pooled = left["pooled"]
            assert 1 <= pooled <= 4 and left["reused"] + pooled <= 4, left
            assert left["before"] == {"maps": 2 * pooled, "fds": pooled}
            assert left["after"] == {"maps": 0, "fds": 0}
            assert (await keepers[1].get("b3"))[:2] == b"\x03\x03"

    run_trio(body, timeout=150)


def test_an_unread_temporary_buffer_goes_at_its_deadline_without_another_offer() -> None:
    """A cast whose target never reads (unreachable, or died first): its buffer goes TEMP_TTL s
    after it was sent, its snapshot file to the pool, closed IDLE s later, by the registry's
    timer (MockClock: no real waiting)."""

    async def body() -> None:
        async with serving_channel("expiry") as channel:
            channel.offer(torch.ones(MAP_ABOVE // 4), None)  # a snapshot: a memfd
            await trio.sleep(10)
            channel.offer(memoryview(bytearray(2 * MIB)), None)  # a copy
            stats = channel.registry.statistics()
            assert (stats.buffers, stats.expiring, stats.snapshots) == (2, 2, 1)
            assert memfd_leftovers(os.getpid())["fds"] == 1
            await trio.sleep(TEMP_TTL - 11)
            assert channel.registry.statistics().buffers == 2  # not yet
            await trio.sleep(2)  # the first one's deadline passed: its file waits in the pool
            stats = channel.registry.statistics()
            assert (stats.buffers, stats.snapshots, stats.pooled) == (1, 0, 1)
            assert memfd_leftovers(os.getpid()) == {"maps": 2, "fds": 1}
            await trio.sleep(10)
            assert channel.registry.statistics().buffers == 0
            await trio.sleep(IDLE - 12)  # not yet
            assert channel.registry.statistics().pooled == 1
            await trio.sleep(2)  # unused for IDLE s: closed
            assert channel.registry.statistics().pooled == 0
            assert memfd_leftovers(os.getpid()) == {"maps": 0, "fds": 0}

    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))
