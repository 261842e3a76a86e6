"""GPU tensors and the tensor channel. Run on a machine with CUDA (see docs/rdma.md):

    OTPMESH_PRELOAD= python -m pytest tests/gpu -q

Without CUDA every check here skips with the reason. The ``cuda_ipc`` backend is not built: a
GPU tensor cannot be registered as an RDMABuffer (the clear error is checked here), and a GPU
tensor in a call is copied to the CPU by its sender. The checks a ``cuda_ipc`` backend must pass
are here too, expected to fail until it exists (``xfail(strict=True)``: once it passes them,
the marker must go)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the GPU checks need torch")

import otpmesh  # noqa: E402
from otpmesh.rdma import RDMABuffer, RDMAError  # noqa: E402
from otpmesh.rdma._preference import make_backends  # noqa: E402
from tests.conftest import run_trio  # noqa: E402
from tests.gpu.cuda_actors import CudaKeeper  # noqa: E402

MIB = 1 << 20
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here (run on a GPU machine)"
)
cuda_ipc_built = "cuda_ipc" in make_backends()
needs_cuda_ipc = pytest.mark.xfail(
    not cuda_ipc_built,
    strict=True,
    reason="the cuda_ipc backend is not built yet: GPU tensors in calls arrive on the CPU",
)


@pytest.fixture(autouse=True)
def _workers_touch_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTPMESH_PRELOAD", raising=False)
    monkeypatch.delenv("OTPMESH_RDMA_BACKENDS", raising=False)


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())


def test_a_tensor_off_the_cpu_cannot_be_registered_and_the_error_says_what_to_do() -> None:
    """Runs everywhere: a meta tensor stands in for a device tensor."""

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1):
            with pytest.raises(RDMAError, match="a meta tensor: RDMABuffer takes CPU tensors"):
                RDMABuffer(torch.empty(4, device="meta"))

    run_trio(body, timeout=120)


@needs_cuda
@pytest.mark.skipif(cuda_ipc_built, reason="cuda_ipc is built: GPU tensors register")
def test_a_cuda_tensor_cannot_be_registered_without_cuda_ipc() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            with pytest.raises(RDMAError, match="needs the cuda_ipc backend, which this build"):
                RDMABuffer(torch.ones(4, device="cuda"))
            keeper = (await procs.spawn("k", CudaKeeper))[0]
            with pytest.raises(otpmesh.ActorError, match="needs the cuda_ipc backend"):
                await keeper.register(16)

    run_trio(body, timeout=120)


@needs_cuda
def test_a_cuda_tensor_in_a_call_arrives_with_the_same_bits() -> None:
    """Today: copied to the CPU by the sender, exact bits. With cuda_ipc: the same, on the GPU."""
    sent = torch.randn(4 * MIB // 4, device="cuda")

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper = (await procs.spawn("k", CudaKeeper))[0]
            await keeper.keep("t", sent)
            assert await keeper.digest("t") == _bits(sent)

    run_trio(body, timeout=120)


@needs_cuda
@needs_cuda_ipc
@pytest.mark.parametrize("nbytes", [2 * MIB, 64 * MIB])
def test_a_cuda_tensor_argument_arrives_on_the_gpu_bit_exact(nbytes: int) -> None:
    sent = torch.randn(nbytes // 4, device="cuda")

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper = (await procs.spawn("k", CudaKeeper))[0]
            assert (await keeper.keep("t", sent)).startswith("cuda")
            assert await keeper.digest("t") == _bits(sent)

    run_trio(body, timeout=120)


@needs_cuda
@needs_cuda_ipc
def test_a_cuda_tensor_result_arrives_on_the_gpu_bit_exact() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper = (await procs.spawn("k", CudaKeeper))[0]
            got = await keeper.make(16 * MIB // 4, 7)
            assert got.device.type == "cuda"
            g = torch.Generator(device="cuda").manual_seed(7)
            assert _bits(got) == _bits(torch.randn(16 * MIB // 4, device="cuda", generator=g))

    run_trio(body, timeout=120)


@needs_cuda
@needs_cuda_ipc
def test_an_rdma_buffer_of_a_cuda_tensor_reads_and_writes_on_the_gpu() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper = (await procs.spawn("k", CudaKeeper))[0]
            buf = await keeper.register(MIB)
            dst = torch.empty(MIB, device="cuda")
            await buf.read_into(dst)
            assert buf.backend == "cuda_ipc"
            assert torch.equal(dst, torch.arange(MIB, dtype=torch.float32, device="cuda"))
            await buf.write_from(torch.full((MIB,), 2.0, device="cuda"))
            assert await keeper.digest("registered") == _bits(torch.full((MIB,), 2.0))

    run_trio(body, timeout=120)
