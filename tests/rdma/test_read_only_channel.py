"""A value sent in a message is offered as a read-only buffer: a receiver holding its handle can
read it but never write to it (the owner refuses the pin, the tcp backend the transfer, and a
snapshot's pages are not writable where the grant says), so other receivers always get what was
sent."""

from __future__ import annotations

import ctypes
import os

import pytest
import torch

import otpmesh
from otpmesh.rdma import RDMAError
from otpmesh.rdma._backend import Region
from otpmesh.rdma._channel import MAP_ABOVE
from otpmesh.rdma._shm import ShmError, _copy
from otpmesh.rdma._snapshot import Snapshot
from tests.conftest import run_trio
from tests.rdma.channel_actors import BufferKeeper

MIB = 1 << 20
PATTERN = bytes(range(64))


@pytest.fixture(params=["shm", "tcp"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("OTPMESH_PRELOAD", raising=False)
    monkeypatch.setenv("OTPMESH_RDMA_BACKENDS", request.param)
    if request.param == "shm":  # it reaches between workers only outside their sandboxes
        monkeypatch.setenv("OTPMESH_SANDBOX", "0")
    return str(request.param)


@pytest.mark.parametrize("nbytes", [2 * MIB, MAP_ABOVE], ids=["copied", "snapshot"])
def test_a_receiver_cannot_write_into_a_channel_buffer(backend: str, nbytes: int) -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            keepers = await procs.spawn("k", BufferKeeper)
            buf = await keepers[0].offer_one(nbytes)  # as a message would offer it
            said = await keepers[1].write_into(buf, nbytes)
            assert said.startswith(f"RDMAError: buffer {buf._handle.buffer} is read-only"), said
            with pytest.raises(RDMAError, match="read-only: it holds a value sent"):
                await buf.write_from(bytearray(nbytes))  # from the controller too
            assert await keepers[1].read_from(buf) == PATTERN  # reads still work, unchanged

    run_trio(body, timeout=150)


def test_the_tcp_backend_refuses_a_write_to_a_read_only_buffer_itself() -> None:
    """Even a reader that skips the owner's check (a pin for reading, then a write) is refused
    by the owner's tcp server."""
    from otpmesh.rdma._tcp import TcpBackend
    from tests.rdma.test_tcp_backend import peer

    async def body() -> None:
        owner, reader = TcpBackend(), TcpBackend()
        data = bytearray(PATTERN)
        region = Region(ctypes.addressof(ctypes.c_char.from_buffer(data)), len(data))
        entry = owner.register(1, region, writable=False)
        incoming = bytearray(len(data))
        local = Region(ctypes.addressof(ctypes.c_char.from_buffer(incoming)), len(incoming))
        with pytest.raises(ConnectionError, match="buffer 1 is read-only"):
            await reader.write(entry, peer(owner), local, 0)
        await reader.read(entry, peer(owner), local, 0)
        assert bytes(incoming) == PATTERN == bytes(data)

    run_trio(body, timeout=30)


def test_a_snapshots_pages_refuse_a_kernel_copy_into_them() -> None:
    """process_vm_writev at the address a snapshot's grant names fails: the owner offers the
    backends a read-only mapping (it fills the file through another), whoever holds the
    address; so too after a refill."""
    source = torch.arange(1024, dtype=torch.int32)
    snap = Snapshot.of(Region(source.data_ptr(), source.numel() * 4))
    snap.fill(Region(source.data_ptr(), source.numel() * 4))  # a refill, as the pool does
    try:
        scribble = bytearray(16)
        local = Region(ctypes.addressof(ctypes.c_char.from_buffer(scribble)), 16)
        with pytest.raises(ShmError, match="Bad address"):
            _copy(os.getpid(), local, snap.region.address, write=True)
        back = (ctypes.c_char * 16).from_address(snap.region.address)
        assert bytes(back) == bytes(source[:4].numpy().tobytes())
    finally:
        snap.close()
