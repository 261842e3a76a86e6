"""Warm receive memory (``otpmesh/rdma/_receive.py``): a large value read from another host lands
in memory the receiver already faulted in, which comes back when its last user is freed."""

from __future__ import annotations

import ctypes
import gc

import pytest
import torch
import trio
import trio.testing

import otpmesh
from otpmesh.rdma._channel import MAP_ABOVE
from otpmesh.rdma._pool import IDLE
from tests.conftest import run_trio
from tests.rdma.channel_actors import Keeper, serving_channel


@pytest.fixture(autouse=True)
def _workers_touch_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTPMESH_PRELOAD", raising=False)
    monkeypatch.delenv("OTPMESH_CHANNEL_POOL", raising=False)


def _mapped_at(address: int) -> bool:
    """Whether `address` lies in a mapping of this process (neighbouring anonymous mappings
    may merge, so not only where one starts)."""
    with open("/proc/self/maps") as f:
        for line in f:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start <= address < end:
                return True
    return False


def test_a_block_comes_back_warm_is_lent_again_and_goes_when_idle_or_the_node_stops() -> None:
    async def body() -> None:
        async with serving_channel("receive") as channel:
            pool = channel.registry.receive
            memory = pool.take(MAP_ABOVE)
            address = ctypes.addressof(memory)
            tensor = torch.frombuffer(memory, dtype=torch.uint8)
            tensor.fill_(7)
            del memory, tensor  # the last user: the block comes back, in the run's thread
            await trio.testing.wait_all_tasks_blocked()
            assert pool.free == 1
            again = pool.take(MAP_ABOVE - 4096)  # fits: more than half of it
            assert (ctypes.addressof(again), pool.reused, pool.free) == (address, 1, 0)
            assert pool.take(MAP_ABOVE // 4) is not None  # none free: a new block, dropped
            del again
            gc.collect()
            await trio.testing.wait_all_tasks_blocked()
            assert (pool.free, pool.reused) == (2, 1) and _mapped_at(address)
            await trio.sleep(IDLE + 1)  # unused for IDLE s: unmapped by the registry's timer
            assert pool.free == 0 and not _mapped_at(address)
            kept = pool.take(MAP_ABOVE)
            address = ctypes.addressof(kept)
        # the node stopped with the block lent out: unmapped when it comes back, not kept
        del kept
        await trio.testing.wait_all_tasks_blocked()
        assert pool.free == 0 and not _mapped_at(address)

    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_block_back_after_its_node_stopped_is_unmapped_and_the_run_goes_on() -> None:
    """Nothing started the registry's timer while the node served (no block came back then):
    a block freed after the node stopped, in the same trio run, is unmapped at once."""

    async def body() -> None:
        async with serving_channel("late") as channel:
            pool = channel.registry.receive
            kept = pool.take(MAP_ABOVE)
            address = ctypes.addressof(kept)
        del kept
        await trio.testing.wait_all_tasks_blocked()
        assert pool.free == 0 and not _mapped_at(address)
        await trio.sleep(1)  # the run goes on

    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


def test_values_read_over_tcp_land_in_warm_blocks_both_ways(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTPMESH_RDMA_BACKENDS", "tcp")  # as between hosts: nothing is mapped
    numel = MAP_ABOVE // 4
    value = torch.empty(numel)

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper = (await procs.spawn("k", Keeper))[0]
            for step in range(6):  # arguments: the callee drops each after its call
                assert await keeper.holds(value.fill_(float(step)), float(step)), step
            stats = await keeper.channel_statistics()
            assert stats["receive_reused"] >= 3, stats
            await keeper.keep("w", value.fill_(-1.0))
            got = None
            for _ in range(4):  # results: the controller drops the previous one each time
                got = await keeper.get("w")
                assert bool((got == -1.0).all())
            from otpmesh._node._node import current_node

            registry = current_node().channel.registry  # type: ignore[union-attr]
            assert registry.statistics().receive_reused >= 2

    run_trio(body, timeout=150)
