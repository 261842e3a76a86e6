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
from tests.rdma.nodes import owner_and_reader


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
        async with owner_and_reader() as (_, reader):
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

    run_trio(body, timeout=60)


def test_a_failed_side_dial_fails_everyone_waiting_on_it_without_dialing_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Eight first transfers to an owner nobody can reach: one dial, and all eight fail with it
    # (before, each waiter dialed again in turn: eight dial timeouts for the last one).
    from otpmesh._node import _node

    dials = []
    real_dial = _node.dial

    async def counted(addr: str, secret: bytes | None) -> object:
        dials.append(addr)
        await trio.sleep(0.2)  # a slow refusal: the others are waiting on this dial by now
        return await real_dial(addr, secret)

    monkeypatch.setattr(_node, "dial", counted)

    async def body() -> None:
        reader = Node("reader", secret=new_app_secret(), channel=Channel)
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.serve)
            gone = "unix:/nonexistent/otpmesh-owner"
            errors: list[BaseException] = []

            async def first_transfer() -> None:
                try:
                    await reader.connect_side(gone)
                except OSError as exc:
                    errors.append(exc)

            async with trio.open_nursery() as transfers:
                for _ in range(8):
                    transfers.start_soon(first_transfer)
            assert len(errors) == 8 and dials == [gone]
            nursery.cancel_scope.cancel()

    run_trio(body, timeout=60)
