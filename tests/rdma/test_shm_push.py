"""A non-dumpable owner (the controller) copies for its readers over ``shm`` (docs/rdma.md,
"Owners nobody may read"): its grant names no address, reads and writes arrive bit for bit, and
it copies only for a connection holding a pin, inside the buffer, and writes only what takes
writes. Two real nodes over a real Unix connection, in this (non-dumpable) process."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
import torch
import trio

from otpmesh._core._dumpable import dumpable, make_undumpable
from otpmesh._node._node import set_current_node
from otpmesh.rdma import RDMABuffer
from otpmesh.rdma._backend import Region
from otpmesh.rdma._registry import registry
from tests.conftest import run_trio
from tests.rdma.nodes import owner_and_reader


def _copy_request(buf: RDMABuffer, **payload: Any) -> dict[str, Any]:
    h = buf._handle
    return {
        "op": "backend",
        "buffer": h.buffer,
        "token": h.token,
        "backend": "shm",
        "request": "copy",
        "payload": {"address": 4096, "nbytes": 16, "offset": 0, "write": False, **payload},
    }


def test_a_non_dumpable_owner_copies_for_its_readers_and_only_within_a_pin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTPMESH_RDMA_BACKENDS", "shm")
    monkeypatch.delenv("OTPMESH_DUMPABLE", raising=False)
    make_undumpable()  # what the controller does at start
    assert not dumpable()

    async def body() -> None:
        async with owner_and_reader() as (owner, reader):
            weights = torch.arange(1 << 20, dtype=torch.int32)  # 4 MiB: copied in threads
            buf = RDMABuffer(weights)
            (reg,) = registry(owner).buffers.values()
            assert reg.grant["entries"]["shm"] == {"nbytes": weights.nbytes, "push": True}

            set_current_node(reader)
            got = torch.empty_like(weights)
            await buf.read_into(got)
            assert buf.backend == "shm" and torch.equal(got, weights)
            await buf.write_from(torch.full_like(weights, 7))
            assert bool((weights == 7).all())

            # By hand, as a compromised reader would: no pin, no copy (a buffer never pinned).
            set_current_node(owner)
            unpinned = RDMABuffer(torch.zeros(16, dtype=torch.uint8))
            set_current_node(reader)
            conn = await reader.connect_side(owner.addr)
            with pytest.raises(Exception, match="needs a pin"):
                await reader.sys_call(conn, "rdma", _copy_request(unpinned), "buffer")
            pin = {"op": "pin", "buffer": buf._handle.buffer, "token": buf._handle.token}
            await reader.sys_call(conn, "rdma", pin, "buffer")
            with pytest.raises(Exception, match="fall outside"):
                await reader.sys_call(conn, "rdma", _copy_request(buf, offset=weights.nbytes), "b")
            with pytest.raises(Exception, match="malformed shm copy"):
                await reader.sys_call(conn, "rdma", _copy_request(buf, write="yes"), "b")

            # A value sent in a message is read-only: no copy out of the reader into it.
            set_current_node(owner)
            sent = bytes(range(64))
            address = ctypes.cast(ctypes.c_char_p(sent), ctypes.c_void_p).value or 0
            frozen = RDMABuffer._offered(
                owner, sent, Region(address, len(sent)), None, None, snapshot=False
            )
            set_current_node(reader)
            frozen_pin = {
                "op": "pin",
                "buffer": frozen._handle.buffer,
                "token": frozen._handle.token,
            }
            await reader.sys_call(conn, "rdma", frozen_pin, "buffer")
            with pytest.raises(Exception, match="read-only"):
                await reader.sys_call(conn, "rdma", _copy_request(frozen, write=True), "b")

    run_trio(body, timeout=60)


def test_a_push_copy_holds_its_buffer_until_it_ends_whatever_the_reader_and_owner_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The copy runs in threads while the owner goes on: a reader's unpin and the owner's drop
    # during it must not forget the buffer (nor refill its snapshot) under the copy.
    monkeypatch.setenv("OTPMESH_RDMA_BACKENDS", "shm")
    monkeypatch.delenv("OTPMESH_DUMPABLE", raising=False)
    make_undumpable()

    async def body() -> None:
        async with owner_and_reader() as (owner, reader):
            buf = RDMABuffer(torch.arange(16, dtype=torch.uint8))
            owned = registry(owner)
            backend = owned.usable["shm"]
            started, release = trio.Event(), trio.Event()
            real_serve = backend.serve

            async def copy_when_released(op: str, payload: Any, caller: Any) -> Any:
                started.set()
                await release.wait()
                return await real_serve(op, payload, caller)

            monkeypatch.setattr(backend, "serve", copy_when_released)
            set_current_node(reader)
            conn = await reader.connect_side(owner.addr)
            handle = {"buffer": buf._handle.buffer, "token": buf._handle.token}
            await reader.sys_call(conn, "rdma", {"op": "pin", **handle}, "buffer")
            landing = ctypes.create_string_buffer(16)
            address = ctypes.addressof(landing)

            async def copy() -> None:
                await reader.sys_call(conn, "rdma", _copy_request(buf, address=address), "b")

            async with trio.open_nursery() as copying:
                copying.start_soon(copy)
                await started.wait()
                await reader.sys_call(conn, "rdma", {"op": "unpin", **handle}, "buffer")
                owned.drop(buf._handle.buffer)
                assert buf._handle.buffer in owned.buffers  # held by the copy in flight
                release.set()
            assert buf._handle.buffer not in owned.buffers  # and let go once it ended
            assert landing.raw == bytes(range(16))

    run_trio(body, timeout=60)
