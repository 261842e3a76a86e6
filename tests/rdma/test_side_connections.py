"""A reader's node opens one side connection per owner, however many first transfers to that
owner start at once (they wait for the one dial, then share it)."""

from __future__ import annotations

import os

import pytest
import torch
import trio

from otpmesh._node._node import Node, set_current_node
from otpmesh._wire._secret import new_app_secret
from otpmesh.rdma import RDMABuffer
from otpmesh.rdma._channel import Channel
from tests.conftest import run_trio


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return count


def test_concurrent_first_transfers_to_one_owner_share_one_side_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTPMESH_RDMA_BACKENDS", "shm")  # no tcp listener to count

    async def body() -> None:
        secret = new_app_secret()
        owner = Node("owner", secret=secret, channel=Channel)
        reader = Node("reader", secret=secret, channel=Channel)
        async with trio.open_nursery() as nursery:
            await nursery.start(owner.serve)
            await nursery.start(reader.serve)
            set_current_node(owner)
            weights = torch.arange(1 << 16, dtype=torch.float32)
            buf = RDMABuffer(weights)
            set_current_node(reader)
            before = _sockets()
            got = [torch.empty_like(weights) for _ in range(8)]
            async with trio.open_nursery() as readers:
                for dst in got:
                    readers.start_soon(buf.read_into, dst)
            assert all(torch.equal(dst, weights) for dst in got)
            assert _sockets() - before == 2  # one connection: the reader's end and the owner's
            nursery.cancel_scope.cancel()

    run_trio(body, timeout=60)
