"""The lockstep loss hands its precomputed gradients to whichever backward Lightning runs, by the chain rule."""

import pytest
import torch
from lightning.pytorch.strategies import Strategy

from lightning_unlearn.strategies import MaskedDDPStrategy, MaskedFSDPStrategy, MaskedSingleDeviceStrategy
from lightning_unlearn.strategies.lockstep import loss_with_gradients


def test_backward_adds_the_given_gradients_times_the_upstream_gradient():
    a, b, frozen = (
        torch.nn.Parameter(torch.zeros(3)),
        torch.nn.Parameter(torch.zeros(2)),
        torch.nn.Parameter(torch.ones(1)),
    )
    a.grad = torch.tensor([1.0, 1.0, 1.0])  # an earlier batch of an accumulation
    loss = loss_with_gradients(
        torch.tensor(2.5), {a: torch.tensor([0.5, 0.0, -2.0]), b: torch.tensor([4.0, 8.0]), frozen: None}
    )
    assert loss.requires_grad and float(loss) == 2.5
    (loss / 4).backward()  # Lightning divides the step loss by accumulate_grad_batches
    assert torch.equal(a.grad, torch.tensor([1.125, 1.0, 0.5]))
    assert torch.equal(b.grad, torch.tensor([1.0, 2.0]))
    assert frozen.grad is None


def test_the_gradients_are_delivered_once():
    p = torch.nn.Parameter(torch.zeros(2))
    loss = loss_with_gradients(torch.tensor(1.0), {p: torch.ones(2)})
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backpropagated twice"):
        loss.backward()


@pytest.mark.parametrize("strategy", [MaskedSingleDeviceStrategy, MaskedDDPStrategy, MaskedFSDPStrategy])
def test_masked_strategies_keep_lightnings_backward(strategy):
    """No masked strategy replaces Strategy.backward: a Lightning change to it reaches them unedited."""
    assert strategy.backward is Strategy.backward
