"""The tensor channel between sandboxed workers (``otpmesh/_core/_sandbox.py``): a worker in a
Landlock domain of its own may not read or write another process's memory, and no other worker
may read or write its, so ``shm`` no longer copies between two workers; it still copies between
a worker and the controller (outside every domain), whichever owns the buffer. Tensors still
move between workers: ``RDMABuffer`` transfers over ``tcp``, values in messages mapped or
copied (docs/rdma.md, docs/security.md). Real processes, real syscalls."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

import pytest
import torch

import otpmesh
from otpmesh._core import _sandbox
from otpmesh._core._dumpable import dumpable
from otpmesh.rdma import RDMABuffer
from tests.actors import Echo, TensorOwner, TensorReader
from tests.conftest import run_trio

MIB = 1 << 20

pytestmark = pytest.mark.skipif(
    _sandbox.unavailable() is not None, reason=f"no sandbox here: {_sandbox.unavailable()}"
)


@pytest.fixture(autouse=True)
def _sandboxed_workers_with_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTPMESH_PRELOAD", raising=False)  # these workers do touch tensors
    monkeypatch.delenv(_sandbox.ENV, raising=False)


async def _pair() -> tuple[otpmesh.ProcMesh, otpmesh.ActorRef, otpmesh.ActorRef]:
    procs = await otpmesh.proc_mesh(procs=2)
    owners = await procs.spawn("owner", TensorOwner)
    readers = await procs.spawn("reader", TensorReader)
    return procs, owners[0], readers[1]  # owner and reader in different processes


def test_between_two_sandboxed_workers_a_buffer_moves_over_tcp(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTPMESH_RDMA_BACKENDS", "shm,tcp")

    async def body() -> None:
        procs, owner, reader = await _pair()
        async with procs:
            numel = 1 << 20  # 4 MiB
            buf = await owner.register(1, numel)
            got = await reader.read(buf, numel)
            assert got["backend"] == "tcp"
            assert torch.equal(got["tensor"], torch.arange(numel, dtype=torch.float32))
            assert await reader.write(buf, torch.full((numel,), 7.0)) == "tcp"
            assert torch.equal(await owner.value(1), torch.full((numel,), 7.0))

    run_trio(body, timeout=120)
    # What every app's workers do now is no warning (said at INFO, which workers do not log).
    out, err = capfd.readouterr()
    assert "tensor channel: using tcp" not in out + err


def test_shm_alone_between_sandboxed_workers_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTPMESH_RDMA_BACKENDS", "shm")

    async def body() -> None:
        procs, owner, reader = await _pair()
        async with procs:
            buf = await owner.register(1, 16)
            with pytest.raises(
                otpmesh.ActorError,
                match=r"no backend reaches the owner of buffer \d+: it offers \['shm'\].*"
                r"this worker is sandboxed \(docs/security.md\), so shm reaches no other "
                r"worker: allow tcp too \(OTPMESH_RDMA_BACKENDS=shm,tcp\) or set "
                r"OTPMESH_SANDBOX=0",
            ):
                await reader.read_wrong(buf, [16], "float32")

    run_trio(body, timeout=120)


def test_the_controller_and_a_sandboxed_worker_still_copy_over_shm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTPMESH_RDMA_BACKENDS", "shm")

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            owner = (await procs.spawn("owner", TensorOwner))[0]
            reader = (await procs.spawn("reader", TensorReader))[0]
            numel = 1 << 20
            # A worker's buffer, read and written by the controller (it reads the worker).
            theirs = await owner.register(1, numel)
            local = torch.zeros(numel)
            await theirs.read_into(local)
            assert theirs.backend == "shm"
            assert torch.equal(local, torch.arange(numel, dtype=torch.float32))
            await theirs.write_from(torch.full((numel,), 3.0))
            assert torch.equal(await owner.value(1), torch.full((numel,), 3.0))
            # The controller's buffer, read and written by the worker (the controller copies).
            mine = torch.arange(numel, dtype=torch.float32)
            got = await reader.read(RDMABuffer(mine), numel)
            assert got["backend"] == "shm" and torch.equal(got["tensor"], mine)
            assert await reader.write(RDMABuffer(mine), torch.full((numel,), 5.0)) == "shm"
            assert bool((mine == 5.0).all())

    run_trio(body, timeout=120)


@pytest.fixture
def dumpable_controller(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as a controller under ``OTPMESH_DUMPABLE=1`` (an earlier test's controller
    cleared its flag: set again, and restored after)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    was = dumpable()
    monkeypatch.setenv("OTPMESH_DUMPABLE", "1")
    prctl(4, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    try:
        yield
    finally:
        prctl(4, *map(ctypes.c_ulong, (int(was), 0, 0, 0)))


def test_a_sandboxed_worker_has_a_dumpable_controller_copy_for_it(
    monkeypatch: pytest.MonkeyPatch, dumpable_controller: None
) -> None:
    # The controller's entry names an address, which the sandboxed worker may not read: it asks.
    monkeypatch.setenv("OTPMESH_RDMA_BACKENDS", "shm")
    assert dumpable()

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            reader = (await procs.spawn("reader", TensorReader))[0]
            mine = torch.arange(1 << 20, dtype=torch.float32)
            buf = RDMABuffer(mine)
            got = await reader.read(buf, mine.numel())
            assert got["backend"] == "shm" and torch.equal(got["tensor"], mine)

    run_trio(body, timeout=120)


@pytest.mark.parametrize("nbytes", [4 * MIB, 64 * MIB], ids=["copied", "mapped"])
def test_values_in_messages_still_move_between_sandboxed_workers(nbytes: int) -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            echoes = await procs.spawn("echo", Echo)
            sent = torch.arange(nbytes // 4, dtype=torch.int32).mul_(-1640531535)
            # Worker 0 sends it to worker 1 (an argument), which sends it back (its result).
            got = await echoes[0].call_peer(echoes[1], sent)
            assert torch.equal(got["value"], sent)
            assert got["via_pid"] != os.getpid()

    run_trio(body, timeout=120)
