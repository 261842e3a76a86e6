"""bytes, bytearray, memoryview and numpy arrays of the channel threshold or more travel over the
tensor channel like tensors: the receiver gets the sender's type back, bit for bit, its own and
writable (bytes aside), and never the sender's later writes. No `import otpmesh.rdma` needed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import otpmesh
from otpmesh._node._node import current_node
from otpmesh._wire._tensors import CHANNEL_THRESHOLD
from otpmesh.rdma._channel import MAP_ABOVE
from tests.conftest import run_program, run_trio
from tests.rdma.channel_actors import BufferKeeper

np = pytest.importorskip("numpy", reason="numpy is optional (the 'test' extra installs it)")

MIB = 1 << 20
# Every kind of numpy dtype that travels as raw bytes, both byte orders where there are two.
NP_DTYPES = [
    "|b1", "|i1", "|u1", "<i2", ">i2", "<u4", "<i8", ">u8", "<f2", "<f4", ">f4", "<f8", ">f8",
    "<c8", "<c16", ">c16", "<M8[ns]", "<m8[s]", "|S7", "<U3", "|V5",
]  # fmt: skip


@pytest.fixture(autouse=True)
def _workers_touch_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTPMESH_PRELOAD", raising=False)
    monkeypatch.delenv("OTPMESH_RDMA_BACKENDS", raising=False)


def _array(dtype: str, nbytes: int, seed: int, odd: int) -> Any:
    """Random bits (NaNs, every pattern) of `dtype`, `nbytes` or a little more, 2-d."""
    dt = np.dtype(dtype)
    numel = -(-nbytes // dt.itemsize) + odd
    raw = np.random.default_rng(seed).integers(0, 256, numel * dt.itemsize, dtype=np.uint8)
    if dt.kind == "b":
        raw &= 1
    cols = 3 if numel % 3 == 0 else 1
    return raw.view(dt).reshape(-1, cols)


def _offered_here() -> int:
    node = current_node()
    registry = None if node is None else node.channel._registry  # type: ignore[union-attr]
    return 0 if registry is None else registry._issued


def _values(nbytes: int, seed: int) -> dict[str, Any]:
    raw = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    floats = np.frombuffer(raw, dtype=np.float32).reshape(4, -1)
    return {
        "bytes": raw,
        "bytearray": bytearray(raw),
        "memoryview": memoryview(bytearray(raw)),
        "memoryview-2d": memoryview(floats.copy()),  # format 'f', shape (4, n)
        "memoryview-strided": memoryview(bytearray(raw))[::2],  # not contiguous
        "memoryview-of-bytes": memoryview(raw)[1:],  # read-only, part of a bytes
        "ndarray": floats.copy(),
        "ndarray-fortran": np.asfortranarray(floats),
        "ndarray-readonly": np.frombuffer(raw, dtype=">u2"),
    }


def _expected(value: Any) -> dict[str, Any]:
    if isinstance(value, np.ndarray):
        return {"type": "ndarray", "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, memoryview):
        return {"type": "memoryview", "format": value.format, "shape": list(value.shape)}
    return {"type": type(value).__name__}


def _raw(value: Any) -> bytes:
    return value.tobytes() if isinstance(value, np.ndarray | memoryview) else bytes(value)


def _check(info: dict[str, Any], sent: Any) -> None:
    for field, want in _expected(sent).items():
        assert info[field] == want, (field, info[field], want)
    assert info["raw"] == _raw(sent)
    assert info["writable"] == (info["type"] != "bytes")


@pytest.mark.parametrize("nbytes", [2 * MIB, MAP_ABOVE], ids=["copied", "mapped"])
def test_bytes_likes_and_arrays_arrive_as_their_own_type_both_ways(nbytes: int) -> None:
    sent = _values(nbytes, seed=nbytes)

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper = (await procs.spawn("k", BufferKeeper))[0]
            before = _offered_here()
            for key, value in sent.items():
                await keeper.keep(key, value)  # an argument
                _check(await keeper.describe(key), value)
                back = await keeper.get(key)  # a result
                info = _expected(back)
                assert info == _expected(value), key
                assert _raw(back) == _raw(value), key
                if not isinstance(back, bytes):
                    assert not (
                        back.flags.writeable is False
                        if isinstance(back, np.ndarray)
                        else memoryview(back).readonly
                    ), key
            assert _offered_here() - before == len(sent)  # each one rode the channel
            if nbytes >= MAP_ABOVE:
                assert await keeper.mapped("ndarray") and await keeper.mapped("memoryview")
            stats = current_node().channel.registry.statistics()  # type: ignore[union-attr]
            assert stats.buffers == 0  # the calls are over: nothing offered is left

    run_trio(body, timeout=150)


def test_receivers_never_see_the_senders_later_writes_nor_each_others() -> None:
    sent = {
        "bytearray": bytearray(os.urandom(MAP_ABOVE)),
        "ndarray": np.arange(MIB // 2, dtype=np.int32),  # 2 MiB: the copied path
        "memoryview": memoryview(bytearray(os.urandom(2 * MIB))),
    }
    original = {key: _raw(value) for key, value in sent.items()}

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            keepers = await procs.spawn("k", BufferKeeper)
            for key, value in sent.items():
                await keepers.keep(key, value)  # a broadcast: one offer, two readers
                view = value.reshape(-1).view("u1") if isinstance(value, np.ndarray) else value
                view[0] ^= 0xFF  # the sender writes after the call
                for info in (await keepers.describe(key)).values():
                    assert info["raw"] == original[key], key
                await keepers[0].scribble(key)  # one receiver writes to its own
                assert (await keepers[1].describe(key))["raw"] == original[key], key
                assert (await keepers[0].describe(key))["raw"] != original[key], key

    run_trio(body, timeout=150)


@settings(
    max_examples=2,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # each example starts processes: no shrinking
    suppress_health_check=list(HealthCheck),
)
@given(seed=st.integers(0, 2**31), odd=st.integers(0, 5), mapped=st.sampled_from(NP_DTYPES))
def test_every_numpy_dtype_crosses_the_channel_bit_exact_both_ways(
    seed: int, odd: int, mapped: str
) -> None:
    """Each dtype just above the threshold (copied) and one drawn dtype above MAP_ABOVE."""
    sent = {d: _array(d, CHANNEL_THRESHOLD, seed + i, odd) for i, d in enumerate(NP_DTYPES)}
    sent["mapped"] = _array(mapped, MAP_ABOVE, seed, odd)

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper = (await procs.spawn("k", BufferKeeper))[0]
            await keeper.keep("all", sent)  # one message, every dtype in it
            back = await keeper.get("all")
            for key, array in sent.items():
                got = back[key]
                assert type(got) is np.ndarray and got.dtype == array.dtype, key
                assert got.shape == array.shape and got.tobytes() == array.tobytes(), key
                assert got.flags.writeable, key

    run_trio(body, timeout=150)


PLAIN_PROGRAM = """
import numpy

import otpmesh
from otpmesh._node._node import current_node


class Holder(otpmesh.Actor):
    @otpmesh.endpoint
    def echo(self, value):
        return value

    @otpmesh.endpoint
    def offered(self) -> int:
        return current_node().channel.registry._issued


async def main() -> None:
    async with await otpmesh.proc_mesh(procs=1) as procs:
        holder = (await procs.spawn("h", Holder))[0]
        sent = [bytearray(64 << 20), numpy.ones(1 << 20)]
        back = await holder.echo(sent)
        assert type(back[0]) is bytearray and back[0] == sent[0]
        assert type(back[1]) is numpy.ndarray and (back[1] == sent[1]).all()
        mine = current_node().channel.registry._issued
        print("controller offered", mine, "worker offered", await holder.offered())


if __name__ == "__main__":
    otpmesh.run(main)
"""


def test_a_plain_import_otpmesh_program_sends_bytes_and_arrays_over_the_channel(
    tmp_path: Path,
) -> None:
    done = run_program(tmp_path / "plain.py", PLAIN_PROGRAM)
    assert done.returncode == 0, done.stderr
    assert "controller offered 2 worker offered 2" in done.stdout, done.stdout


def test_small_values_stay_inline_and_arrays_keep_their_type() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper = (await procs.spawn("k", BufferKeeper))[0]
            small = np.arange(12, dtype="<i2").reshape(3, 4)
            await keeper.keep("a", small)
            back = await keeper.get("a")
            assert back.dtype == small.dtype and np.array_equal(back, small)
            await keeper.keep("b", bytearray(b"abc"))
            assert await keeper.get("b") == b"abc"  # below the threshold: msgpack bin
            assert current_node().channel._registry is None  # type: ignore[union-attr]

    run_trio(body, timeout=150)


def test_a_large_bytearray_nested_deeper_than_the_quick_check_still_rides_the_channel() -> None:
    deep = {"a": [[[[bytearray(b"x" * CHANNEL_THRESHOLD)]]]]}

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper = (await procs.spawn("k", BufferKeeper))[0]
            before = _offered_here()
            await keeper.keep("deep", deep)
            assert _offered_here() == before + 1
            got = await keeper.get("deep")
            assert type(got["a"][0][0][0][0]) is bytearray
            assert got == deep

    run_trio(body, timeout=150)
