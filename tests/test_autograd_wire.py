"""A tensor's autograd state travels with its values: requires_grad, and nn.Parameter (frozen or
not), inline and over the tensor channel. Its history never does (it arrives as a leaf)."""

from __future__ import annotations

import pytest
import torch

import otpmesh
from otpmesh._wire._codec import pack, unpack
from tests.actors import Echo
from tests.conftest import run_trio


def _same(got: torch.Tensor, sent: torch.Tensor) -> None:
    assert type(got) is type(sent)
    assert got.requires_grad == sent.requires_grad
    assert got.is_leaf and got.grad_fn is None  # values only: the history stays behind
    assert torch.equal(got.detach(), sent.detach())


@pytest.mark.parametrize(
    "make",
    [
        lambda n: torch.ones(n, requires_grad=True),
        lambda n: torch.nn.Parameter(torch.arange(n, dtype=torch.float32)),
        lambda n: torch.nn.Parameter(torch.ones(n), requires_grad=False),
        lambda n: torch.ones(n) * torch.ones(n, requires_grad=True),  # not a leaf: grad_fn
        lambda n: torch.ones(n),  # plain: no flag on the wire
    ],
    ids=["requires_grad", "parameter", "frozen-parameter", "non-leaf", "plain"],
)
def test_inline_tensors_keep_their_autograd_state(make) -> None:  # type: ignore[no-untyped-def]
    sent = make(8)
    got = unpack(pack({"w": sent}))["w"]
    _same(got, sent if sent.is_leaf else sent.detach().requires_grad_(True))


def test_large_parameters_keep_it_over_the_tensor_channel() -> None:
    big = torch.nn.Parameter(torch.arange(1 << 19, dtype=torch.float32))  # 2 MiB: the channel
    grad = torch.ones(1 << 19, requires_grad=True)

    async def body() -> list[torch.Tensor]:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            echo = (await procs.spawn("e", Echo))[0]
            got: list[torch.Tensor] = await echo.echo([big, grad])
            return got

    got_big, got_grad = run_trio(body)
    _same(got_big, big)
    _same(got_grad, grad)
    assert isinstance(got_big, torch.nn.Parameter)
