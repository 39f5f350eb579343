"""The paper's reference for masked gradients (Lacuna Algorithm 1): one backward per sample, each gradient masked
by its sample's group mask, summed. Slow (B backwards); used by tests and as the benchmark baseline. Torch only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from lightning_unlearn.masks import NEUTRAL_GROUP
from lightning_unlearn.strategies.lockstep import select_samples
from lightning_unlearn.strategies.masked_gradients import decode, resolve_param_masks


def microbatch_masked_gradients(
    model: nn.Module,
    packed_masks: Mapping[str, torch.Tensor] | None,
    batch: Any,
    group_ids: torch.Tensor,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
) -> torch.Tensor:
    """Set ``p.grad = (1/B) Σ_k m^{g(k)} ⊙ ∇ℓ_k`` for every trainable parameter, one sample at a time.

    Args:
        model: module whose trainable parameters receive gradients (existing ``.grad`` is overwritten).
        packed_masks: ``{canonical name: uint32}``; ``None`` computes the plain (unmasked) mean gradient.
        batch: per-sample tensors have leading dimension ``B = len(group_ids)``.
        group_ids: ``(B,)`` long, −1 neutral.
        loss_fn: ``(model, one-sample batch) -> that sample's loss``.

    Returns:
        The detached mean loss.
    """
    ids = torch.as_tensor(group_ids).reshape(-1).cpu().long()
    b = int(ids.numel())
    params = [p for p in model.parameters() if p.requires_grad]
    keys = resolve_param_masks(model, packed_masks) if packed_masks is not None else {}
    acc = {p: torch.zeros_like(p) for p in params}
    total = torch.zeros(())
    for k in range(b):
        for p in params:
            p.grad = None
        loss = loss_fn(model, select_samples(batch, torch.tensor([k]), b))
        loss.backward()
        total += loss.detach().cpu()
        g = int(ids[k])
        with torch.no_grad():
            for p in params:
                if p.grad is None:
                    continue
                grad = p.grad
                if packed_masks is not None and g != NEUTRAL_GROUP:
                    grad = grad * decode(packed_masks[keys[p]].to(grad.device), g)
                acc[p] += grad
    for p in params:
        p.grad = acc[p] / b
    return total / b
