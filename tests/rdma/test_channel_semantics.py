"""What a large tensor in a call is, on the receiving side: exactly the sender's bits, as they were
when the call was made, the receiver's own (mapped copy-on-write from one snapshot on one host),
and nothing left behind when either side is SIGKILLed."""

from __future__ import annotations

import gc
import os
import signal

import pytest
import torch
import trio
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import otpmesh
from otpmesh.rdma._channel import MAP_ABOVE
from tests.conftest import run_trio
from tests.rdma.channel_actors import Keeper, memfd_leftovers, settle_and_trim

MIB = 1 << 20
DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
]


@pytest.fixture(autouse=True)
def _workers_touch_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTPMESH_PRELOAD", raising=False)
    monkeypatch.delenv("OTPMESH_RDMA_BACKENDS", raising=False)


def _random(dtype: torch.dtype, nbytes: int, seed: int, odd: int) -> torch.Tensor:
    """Random bits (NaNs, denormals, every pattern), `nbytes` or a little more, a 2-d shape."""
    g = torch.Generator().manual_seed(seed)
    numel = -(-nbytes // dtype.itemsize) + odd
    if dtype is torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool().reshape(-1, 1)
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=g)
    cols = 3 if numel % 3 == 0 else 1
    return raw.view(dtype).reshape(-1, cols)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    )


_NONE = {"maps": 0, "fds": 0}
_NOTHING_POOLED = {"before": _NONE, "after": _NONE, "pooled": 0, "reused": 0}


def _leftovers(pids: list[int]) -> dict[int, dict[str, int]]:
    return {pid: memfd_leftovers(pid) for pid in pids}


def _shm_files() -> set[str]:
    # otpmesh names no file there (its snapshots are memfds); what other programs on the
    # machine make and remove meanwhile (multiprocessing's semaphores: sem.*) is theirs.
    names = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    return {name for name in names if not name.startswith("sem.")}


@settings(
    max_examples=2,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # each example starts processes: no shrinking
    suppress_health_check=list(HealthCheck),
)
@given(seed=st.integers(0, 2**31), odd=st.integers(0, 5), mapped=st.sampled_from(DTYPES))
def test_every_dtype_crosses_the_channel_bit_exact_both_ways(
    seed: int, odd: int, mapped: torch.dtype
) -> None:
    """Each dtype once just above the channel threshold (copied) and, for one drawn dtype, above
    MAP_ABOVE (mapped); arguments to another process and back as its result."""
    os.environ.pop("OTPMESH_PRELOAD", None)
    sent = {str(d): _random(d, MIB, seed + i, odd) for i, d in enumerate(DTYPES)}
    sent["mapped"] = _random(mapped, MAP_ABOVE, seed, odd)

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper = (await procs.spawn("k", Keeper))[0]
            for key, t in sent.items():
                await keeper.keep(key, t)
                assert await keeper.equals(key, t), key  # the argument, in the worker
                back = await keeper.get(key)  # the result, in the controller
                assert _same_bits(back, t), key
            assert await keeper.mapped("mapped")

    run_trio(body, timeout=150)


def test_receivers_never_see_later_writes_and_their_copies_are_their_own() -> None:
    big = torch.arange(MAP_ABOVE // 4, dtype=torch.float32)
    small = torch.arange(MIB // 4, dtype=torch.float32)  # the copied path
    original = {"big": big.clone(), "small": small.clone()}

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            keepers = await procs.spawn("k", Keeper)
            local = await procs.spawn("l", Keeper)  # beside keepers[0]: a same-process call
            for key, t in (("big", big), ("small", small)):
                await keepers.keep(key, t)  # a broadcast: both map (or copy) the one offer
                t.fill_(-1.0)  # the sender writes after the call
                assert (await keepers.equals(key, original[key])).values() == [True, True]
                await keepers[0].add(key, 1.0)  # one receiver writes to its copy
                assert await keepers[1].equals(key, original[key])  # the other does not see it
                assert await keepers[0].equals(key, original[key] + 1)
                # actor to actor, in another process and in the same one
                await keepers[0].send_to(keepers[1], key + "-peer", original[key])
                await keepers[0].send_to(local[0], key + "-local", original[key])
                await keepers[0].add(key + "-peer", 5.0)
                assert await keepers[1].equals(key + "-peer", original[key])
                assert await local[0].equals(key + "-local", original[key])
                # a result: the controller's copy and the actor's are apart, both ways
                got = await keepers[1].get(key)
                got.add_(3.0)
                assert await keepers[1].equals(key, original[key])
                await keepers[1].add(key, 2.0)
                assert torch.equal(got, original[key] + 3)
            assert await keepers[1].mapped("big") and not await keepers[1].mapped("small")
            assert await local[0].mapped("big-local")

    run_trio(body, timeout=150)


def test_many_readers_read_one_buffer_at_once() -> None:
    from otpmesh.rdma import RDMABuffer

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=4) as procs:
            readers = await procs.spawn("r", Keeper)
            t = torch.randn(8 * MIB // 4)
            buf = RDMABuffer(t)
            got = await readers.read(buf)  # four processes pin and copy concurrently
            assert all(torch.equal(x, t) for x in got)
            buf.drop()

    run_trio(body, timeout=150)


def test_a_sigkilled_reader_leaves_no_snapshot_mapping_fd_or_file() -> None:
    before = _shm_files()
    big = torch.ones(MAP_ABOVE // 4)

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            keepers = await procs.spawn("k", Keeper)
            await keepers[1].keep("kept", big)  # mapped in worker 1, call over
            async with trio.open_nursery() as nursery:

                async def doomed() -> None:
                    with pytest.raises(otpmesh.OtpmeshError):
                        await keepers[1].hold(big)  # in flight when its process dies

                nursery.start_soon(doomed)
                await trio.sleep(0.5)
                os.kill(procs.pids[1], signal.SIGKILL)
            await keepers[0].keep("kept", big)
            await keepers[0].forget()
            gc.collect()
            # The files worker 1 mapped are orphaned (it may have mapped them): closed, never
            # refilled; the one worker 0 mapped and let go waits in the pool, warm.
            here = await settle_and_trim()
            assert here["reused"] == 0 and here["pooled"] == 1, here
            assert here["before"] == {"maps": 2, "fds": 1}
            assert await keepers[0].settle_and_trim() == _NOTHING_POOLED
            survivors = [os.getpid(), procs.pids[0]]
            assert _leftovers(survivors) == {p: {"maps": 0, "fds": 0} for p in survivors}

    run_trio(body, timeout=150)
    assert _shm_files() - before == set()  # nothing left behind by this test


def test_a_sigkilled_owner_leaves_its_readers_copies_intact_and_nothing_behind() -> None:
    before = _shm_files()
    big = torch.arange(MAP_ABOVE // 4, dtype=torch.float32)

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=3) as procs:
            keepers = await procs.spawn("k", Keeper)
            # worker 0 offers (owns the snapshot) to worker 1, which maps it
            await keepers[0].send_to(keepers[1], "got", big)
            assert await keepers[1].mapped("got")
            os.kill(procs.pids[0], signal.SIGKILL)
            await trio.sleep(0.2)
            assert await keepers[1].equals("got", big)  # its copy outlives the owner
            await keepers[1].add("got", 1.0)
            assert await keepers[1].equals("got", big + 1)
            await keepers[1].forget()
            assert await keepers[1].settle_and_trim() == _NOTHING_POOLED
            # The controller's file worker 0 mapped is orphaned and closed; those worker 1
            # mapped and let go (the arguments of equals) wait in the pool.
            here = await settle_and_trim()
            assert here["pooled"] >= 1 and here["after"] == _NONE, here
            assert here["before"] == {"maps": 2 * here["pooled"], "fds": here["pooled"]}
            survivors = [os.getpid(), procs.pids[1], procs.pids[2]]
            assert _leftovers(survivors) == {p: {"maps": 0, "fds": 0} for p in survivors}

    run_trio(body, timeout=150)
    assert _shm_files() - before == set()  # nothing left behind by this test
