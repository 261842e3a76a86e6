"""The tensor-channel contract, once per backend this machine has: read, write, sizes, dtype and
shape checks, drop, owner death, timeout, and nothing left behind after a SIGKILL.

ibverbs runs where an RDMA device exists (tests/rdma/run_softroce.sh boots one); elsewhere its
case is skipped with the reason."""

from __future__ import annotations

import os
import signal

import pytest
import torch
import trio

import otpmesh
from tests.actors import TensorOwner, TensorReader
from tests.conftest import alive, run_trio


def _cases() -> list[object]:
    from otpmesh.rdma._preference import make_backends

    cases: list[object] = []
    for name in ("shm", "tcp", "ibverbs"):
        backend = make_backends().get(name)
        why = "no ibverbs backend in this build" if backend is None else backend.unavailable()
        cases.append(
            pytest.param(name, marks=pytest.mark.skipif(why is not None, reason=f"{name}: {why}"))
        )
    return cases


@pytest.fixture(params=_cases())
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    os.environ.pop("OTPMESH_PRELOAD", None)  # these workers do touch tensors
    monkeypatch.setenv("OTPMESH_RDMA_BACKENDS", request.param)
    if request.param == "shm":  # it reaches between workers only outside their sandboxes
        monkeypatch.setenv("OTPMESH_SANDBOX", "0")  # (tests/rdma/test_shm_confined.py)
    return str(request.param)


async def _pair() -> tuple[otpmesh.ProcMesh, otpmesh.ActorRef, otpmesh.ActorRef]:
    procs = await otpmesh.proc_mesh(procs=2)
    owners = await procs.spawn("owner", TensorOwner)
    readers = await procs.spawn("reader", TensorReader)
    return procs, owners[0], readers[1]  # owner and reader in different processes


def test_read_and_write_move_exact_bytes(backend: str) -> None:
    async def body() -> None:
        procs, owner, reader = await _pair()
        async with procs:
            for key, numel in enumerate([1, 1024, 1 << 18, 1 << 22]):  # 4 B .. 16 MiB
                buf = await owner.register(key, numel)
                got = await reader.read(buf, numel)
                assert got["backend"] == backend
                assert torch.equal(got["tensor"], torch.arange(numel, dtype=torch.float32))
                new = torch.full((numel,), 7.0)
                assert await reader.write(buf, new) == backend
                assert torch.equal(await owner.value(key), new)
            odd = await owner.register(99, 3, "uint8")  # sizes that are not word multiples
            assert (await reader.read(odd, 3, "uint8"))["tensor"].tolist() == [0, 1, 2]

    run_trio(body, timeout=150)


def test_mismatched_size_dtype_or_shape_is_a_clear_error(backend: str) -> None:
    async def body() -> None:
        procs, owner, reader = await _pair()
        async with procs:
            buf = await owner.register(1, 16)
            with pytest.raises(
                otpmesh.ActorError, match=r"holds float32\[16\], the local tensor is float64\[16\]"
            ):
                await reader.read_wrong(buf, [16], "float64")
            with pytest.raises(
                otpmesh.ActorError,
                match=r"holds float32\[16\], the local tensor is float32\[4, 4\]",
            ):
                await reader.read_wrong(buf, [4, 4], "float32")
            with pytest.raises(otpmesh.ActorError, match=r"float32\[17\]"):
                await reader.read_wrong(buf, [17], "float32")

    run_trio(body, timeout=150)


def test_a_dropped_buffer_cannot_be_read(backend: str) -> None:
    async def body() -> None:
        procs, owner, reader = await _pair()
        async with procs:
            buf = await owner.register(1, 16)
            await owner.drop(1)
            with pytest.raises(
                otpmesh.ActorError, match="RDMAError: buffer 1 was dropped by its owner"
            ):
                await reader.read(buf, 16)
            assert await owner.registered() == 0

    run_trio(body, timeout=150)


def test_a_dead_owner_is_a_clear_error(backend: str) -> None:
    async def body() -> None:
        procs, owner, reader = await _pair()
        async with procs:
            buf = await owner.register(1, 16)
            os.kill(procs.pids[0], signal.SIGKILL)
            with trio.fail_after(30):  # dead, not just signalled
                while alive(procs.pids[0]):
                    await trio.sleep(0.01)
            with pytest.raises(
                otpmesh.ActorError, match=r"RDMAError: the owner of buffer 1 .* is gone"
            ):
                await reader.read(buf, 16)

    run_trio(body, timeout=150)


def test_a_stuck_owner_times_out_with_a_clear_error(backend: str) -> None:
    async def body() -> None:
        procs, owner, reader = await _pair()
        async with procs:
            buf = await owner.register(1, 16)
            os.kill(procs.pids[0], signal.SIGSTOP)
            try:
                with pytest.raises(
                    otpmesh.ActorError, match=r"read of buffer 1 .* timed out after 0.5 s"
                ):
                    await reader.read(buf, 16, timeout=0.5)
            finally:
                os.kill(procs.pids[0], signal.SIGCONT)

    run_trio(body, timeout=150)


def _shm_files() -> set[str]:
    # The soft-RoCE guest has no /dev/shm at all: then nothing can be left there either.
    # otpmesh names no file there (its snapshots are memfds); what other programs on the
    # machine make and remove meanwhile (multiprocessing's semaphores: sem.*) is theirs.
    names = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    return {name for name in names if not name.startswith("sem.")}


def test_a_sigkilled_reader_leaves_no_pin_and_nothing_on_disk(backend: str) -> None:
    before = _shm_files()

    async def body() -> None:
        procs, owner, reader = await _pair()
        async with procs:
            buf = await owner.register(1, 1 << 24)  # 64 MiB: the kill lands mid-transfer
            async with trio.open_nursery() as nursery:

                async def doomed() -> None:
                    try:
                        await reader.read(buf, 1 << 24)
                    except otpmesh.OtpmeshError:
                        pass

                nursery.start_soon(doomed)
                await trio.sleep(0.05)
                os.kill(procs.pids[1], signal.SIGKILL)
            with trio.fail_after(5):
                while await owner.pins():
                    await trio.sleep(0.05)
            await owner.drop(1)
            assert await owner.registered() == 0

    run_trio(body, timeout=150)
    assert _shm_files() - before == set()  # nothing left behind by this test


def test_backends_lists_what_this_process_can_use() -> None:
    names = otpmesh.rdma.backends()
    assert "shm" in names and "tcp" in names
    assert names == sorted(names, key=otpmesh.rdma.PREFERENCE.index)
