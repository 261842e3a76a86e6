"""otpmesh.rdma.flat_parameters: a module's parameters as views into one flat tensor."""

from __future__ import annotations

import pytest
import torch

from otpmesh.rdma import flat_parameters


def test_parameters_become_views_of_one_flat_tensor_in_parameters_to_vector_order() -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    before = torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()
    flat = flat_parameters(module)
    assert torch.equal(flat, before)  # same values, same layout
    flat.copy_(torch.arange(flat.numel(), dtype=flat.dtype))  # what read_into does
    assert torch.equal(torch.nn.utils.parameters_to_vector(module.parameters()), flat)
    out = module(torch.ones(1, 3))  # and the module computes with them, gradients too
    out.sum().backward()
    assert all(p.grad is not None for p in module.parameters())


def test_a_module_without_one_dtype_is_refused_with_what_was_found() -> None:
    with pytest.raises(ValueError, match="has no parameters"):
        flat_parameters(torch.nn.ReLU())
    mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match=r"one dtype and device.*float64"):
        flat_parameters(mixed)


def test_an_optimizer_made_before_flattening_steps_the_flat_tensor_bit_for_bit() -> None:
    # The learner's side of a weight sync: its optimizer exists (with state) before its
    # parameters are flattened, and the registered flat tensor must be the weights after
    # every step, with the same bits as an unflattened twin's, and after a checkpoint load.
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    twin.load_state_dict(module.state_dict())
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (module, twin)]
    x = torch.randn(32, 8)

    def step() -> None:
        for m, optimizer in zip((module, twin), optimizers, strict=True):
            optimizer.zero_grad()
            m(x).square().mean().backward()
            optimizer.step()

    step()  # the optimizer has state before the flattening
    flat = flat_parameters(module)
    for _ in range(3):
        step()
    as_vector = torch.nn.utils.parameters_to_vector(module.parameters())
    assert torch.equal(flat, as_vector)
    assert torch.equal(as_vector, torch.nn.utils.parameters_to_vector(twin.parameters()))
    module.load_state_dict({k: torch.zeros_like(v) for k, v in module.state_dict().items()})
    assert not flat.any()  # a checkpoint load lands in the flat tensor too
