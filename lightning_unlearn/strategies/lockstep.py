"""Exact per-sample masked gradients by one forward+backward per sample group, in lockstep across ranks.

Works for any module and any data parallelism, including FSDP2 where each rank only holds its gradient shard and
its mask shard: every rank runs the same sequence of passes — neutral first, then each group present on ANY rank
(the presence bitmap is all-reduced) — so each reduce-scatter / all-reduce mixes gradients of one group only, and
each rank masks the reduced (local) gradient with its own mask (shard). A rank with no sample of a pass's group
runs a zero-weight pass on one sample so the collectives line up. Pass ``g`` contributes
``(n_g / B) · mean-loss-gradient of its sub-batch``, so the total is the gradient of the batch mean.
This module imports torch only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from lightning_unlearn.distributed import local_view
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.masks import NEUTRAL_GROUP
from lightning_unlearn.strategies.masked_gradients import decode, groups_present


def select_samples(batch: Any, idx: torch.Tensor, batch_size: int) -> Any:
    """The sub-batch of samples ``idx``: every tensor with leading dimension ``batch_size`` is indexed, recursively
    through dicts, lists and tuples; everything else is kept as is."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() and batch.shape[0] == batch_size:
            return batch.index_select(0, idx.to(batch.device))
        return batch
    if isinstance(batch, Mapping):
        return type(batch)({k: select_samples(v, idx, batch_size) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        return type(batch)(select_samples(v, idx, batch_size) for v in batch)
    return batch


def lockstep_masked_backward(
    forward_loss: Callable[[Any], torch.Tensor],
    backward: Callable[[torch.Tensor], None],
    batch: Any,
    group_ids: torch.Tensor,
    param_masks: Mapping[torch.nn.Parameter, torch.Tensor],
    process_group: Any = None,
) -> torch.Tensor:
    """Leave ``Σ_k m^{g(k)} ⊙ ∇ℓ_k / B`` (summed onto any existing ``.grad``) in every parameter's ``.grad``.

    Args:
        forward_loss: sub-batch -> mean loss over its samples (runs the forward).
        backward: runs the backward of a scalar (e.g. ``Tensor.backward`` or a precision plugin's).
        batch: the step's batch; per-sample tensors have leading dimension ``B = len(group_ids)``.
        group_ids: ``(B,)`` long, −1 neutral.
        param_masks: ``{parameter: packed uint32 mask}`` with the shape of the parameter's LOCAL gradient
            (the full tensor without FSDP, this rank's dim-0 shard with FSDP2).
        process_group: the data-parallel group whose ranks must run the same passes (``None``: default group).

    Returns:
        The detached mean loss over this rank's samples.
    """
    ids = torch.as_tensor(group_ids).reshape(-1).cpu().long()
    b = int(ids.numel())
    if b == 0:
        raise ConfigError("lockstep_masked_backward got an empty batch.")
    params = list(param_masks)
    prior = {p: p.grad for p in params}
    acc: dict[torch.nn.Parameter, torch.Tensor | None] = dict.fromkeys(params)
    total = None
    for g in groups_present(ids, process_group):
        idx = (ids == g).nonzero().reshape(-1)
        weight = idx.numel() / b
        if idx.numel() == 0:
            idx = torch.zeros(1, dtype=torch.long)  # zero-weight pass: keeps the collectives in lockstep
        for p in params:
            p.grad = None
        loss = forward_loss(select_samples(batch, idx, b))
        backward(loss * weight)
        total = loss.detach() * weight if total is None else total + loss.detach() * weight
        with torch.no_grad():
            for p in params:
                grad = p.grad
                if grad is None:
                    continue
                if g != NEUTRAL_GROUP:
                    local_view(grad).mul_(decode(param_masks[p], g))
                if acc[p] is None:
                    acc[p] = grad
                else:
                    local_view(acc[p]).add_(local_view(grad))
    with torch.no_grad():
        for p in params:
            grad, before = acc[p], prior[p]
            if before is not None and grad is not None:
                local_view(before).add_(local_view(grad))
                grad = before
            p.grad = grad if grad is not None else before
    return total


def loss_with_gradients(
    loss: torch.Tensor, gradients: Mapping[torch.nn.Parameter, torch.Tensor | None]
) -> torch.Tensor:
    """``loss`` (its value) as a tensor whose gradient with respect to each parameter is ``gradients[parameter]``.

    Lockstep computes the masked gradients inside ``training_step``; returning them as the gradient of the step's
    loss lets the trainer's own backward deliver them (scaled by the chain rule: gradient accumulation, a loss
    scaler), after it has zeroed ``.grad``, through the usual autograd accumulation into ``.grad``.
    """
    params = [p for p, g in gradients.items() if g is not None]
    return _PrecomputedGradients.apply(loss.detach(), [gradients[p] for p in params], *params)


class _PrecomputedGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, gradients: list[torch.Tensor], *params: torch.nn.Parameter):
        ctx.gradients = gradients
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor):
        gradients, ctx.gradients = ctx.gradients, None
        if gradients is None:
            raise RuntimeError("the lockstep loss was backpropagated twice; its gradients are delivered once.")
        scale = float(grad_output)  # a python scalar multiplies a DTensor gradient as well as a plain one
        return None, None, *(g if scale == 1.0 else g * scale for g in gradients)
