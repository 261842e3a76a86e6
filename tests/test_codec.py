"""Messages on the wire: plain data, tuples, and torch tensors, bit-exact and without pickle."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import otpmesh
from otpmesh._wire._codec import pack, unpack
from tests.actors import Echo
from tests.conftest import run_trio

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.complex128,
]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    return bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))


@st.composite
def tensors(draw: Any) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 4), max_size=4))
    raw = draw(st.binary(min_size=0, max_size=0)) if 0 in shape else None
    numel = 1
    for dim in shape:
        numel *= dim
    nbytes = numel * dtype.itemsize
    raw = draw(st.binary(min_size=nbytes, max_size=nbytes))
    t = (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if nbytes
        else torch.empty(0, dtype=torch.uint8)
    )
    t = t.view(dtype).reshape(shape) if nbytes else torch.empty(shape, dtype=dtype)
    if dtype == torch.bool:
        t = t.view(torch.uint8).clamp(0, 1).view(torch.bool) if nbytes else t
    if draw(st.booleans()) and t.dim() >= 2:
        t = t.transpose(0, 1)  # non-contiguous
    return t


@settings(max_examples=200, deadline=None)
@given(tensors())
def test_tensors_round_trip_bit_exactly(t: torch.Tensor) -> None:
    back = unpack(pack(t))
    assert _same_bits(back, t)
    assert back.is_contiguous()
    back.add_(0) if back.dtype not in (torch.bool,) else None  # decoded tensors are writable


def test_zero_dim_bfloat16_and_nested_tensors_round_trip() -> None:
    msg = {"w": [torch.tensor(1.5, dtype=torch.bfloat16), (torch.arange(3), "x")], "n": None}
    back = unpack(pack(msg))
    assert back["w"][0].shape == () and back["w"][0].dtype == torch.bfloat16
    assert isinstance(back["w"][1], tuple)
    assert torch.equal(back["w"][1][0], torch.arange(3))


def test_non_contiguous_and_conjugated_views_send_their_values() -> None:
    base = torch.randn(4, 6, dtype=torch.complex64)
    for view in (base[:, ::2], base.t(), base.conj(), base[1:3, 2:5].t()):
        assert torch.equal(unpack(pack(view)), view.resolve_conj())


def test_plain_data_round_trips_and_tuples_stay_tuples() -> None:
    msg = {"a": (1, (2, 3)), "b": [b"\x00bytes", 1.5, True, None, -(2**63)], 3: "int key"}
    assert unpack(pack(msg)) == msg


def test_unsupported_values_are_refused_with_a_clear_error() -> None:
    with pytest.raises(otpmesh.EncodeError, match=r"cannot send a value of type builtins\.set"):
        pack({1, 2})
    with pytest.raises(otpmesh.EncodeError, match=r"sparse|to_dense"):
        pack(torch.eye(3).to_sparse())
    # A meta tensor has no data: torch's own NotImplementedError said nothing of what to do.
    with pytest.raises(otpmesh.EncodeError, match=r"meta tensor .* materialize it"):
        pack(torch.empty(2, 3, device="meta"))


def test_tensors_round_trip_through_a_worker() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            mesh = await procs.spawn("w", Echo)
            sent = {
                "bf16": torch.randn(5, 3).to(torch.bfloat16),
                "scalar": torch.tensor(7, dtype=torch.int16),
                "strided": torch.arange(24.0).reshape(4, 6)[:, 1::2],
                "nested": [torch.ones(2, dtype=torch.bool), (torch.zeros(0, 2),)],
            }
            back = await mesh[0].echo(sent)
            assert _same_bits(back["bf16"], sent["bf16"])
            assert _same_bits(back["scalar"], sent["scalar"])
            assert _same_bits(back["strided"], sent["strided"])
            assert _same_bits(back["nested"][0], sent["nested"][0])
            assert back["nested"][1][0].shape == (0, 2)

    run_trio(body)


def test_a_controller_that_never_touches_a_tensor_never_imports_torch() -> None:
    code = (
        "import sys, otpmesh\n"
        "from otpmesh._wire._codec import pack, unpack\n"
        "unpack(pack({'a': (1, 2)}))\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
    )
    assert out.stdout.strip() == "False", out.stderr
