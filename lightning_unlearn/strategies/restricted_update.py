"""Restricted-update mode: every parameter update is limited to a fixed mask (e.g. m^F for OracleGrad).

Gradients are masked before the optimizer step (so momentum never sees out-of-mask gradient), and after the step
every out-of-mask element is restored from a snapshot taken just before it, so weight decay and any other
optimizer term leave it bit-for-bit unchanged. Works on plain tensors and on FSDP2 DTensors (local shards with
local mask shards). Plain parameters entirely outside the mask get ``grad = None``, which optimizers skip. The
snapshot holds one copy of every parameter (shard) with at least one element in the mask, for the step only.
Torch only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from lightning_unlearn.distributed import local_view
from lightning_unlearn.masks import group_bits
from lightning_unlearn.strategies.masked_gradients import decode_union


class RestrictedUpdate:
    """Restrict updates of ``param_masks``' parameters to the union of ``groups``.

    Use: ``ru.mask_grads(); ru.snapshot(); optimizer.step(); ru.restore()``.

    Args:
        param_masks: ``{parameter: packed uint32 mask}``, shaped like the parameter's local data (FSDP2: shard).
        groups: the group ids whose union is the update mask.
    """

    def __init__(self, param_masks: Mapping[nn.Parameter, torch.Tensor], groups: Iterable[int]) -> None:
        self.groups = sorted(set(groups))
        group_bits(self.groups)  # validates the ids
        self._masks = dict(param_masks)
        self._saved: dict[nn.Parameter, torch.Tensor] = {}
        # Plain parameters with no element in the mask are skipped by the optimizer altogether.
        self._outside = {
            p for p, m in self._masks.items() if not hasattr(p, "_local_tensor") and not bool(self._allowed(m).any())
        }

    def _allowed(self, packed: torch.Tensor) -> torch.Tensor:
        return decode_union(packed, self.groups)

    @torch.no_grad()
    def mask_grads(self) -> None:
        """Zero every out-of-mask gradient element (``None`` for parameters entirely outside the mask)."""
        for p, m in self._masks.items():
            if p.grad is None:
                continue
            if p in self._outside:
                p.grad = None
            else:
                local_view(p.grad).mul_(self._allowed(m))

    @torch.no_grad()
    def snapshot(self) -> None:
        """Remember the current values of the parameters the optimizer may touch."""
        self._saved = {p: local_view(p.data).clone() for p in self._masks if p not in self._outside}

    @torch.no_grad()
    def restore(self) -> None:
        """Put every out-of-mask element back to its snapshot value."""
        for p, saved in self._saved.items():
            data = local_view(p.data)
            data.copy_(torch.where(self._allowed(self._masks[p]), data, saved))
        self._saved = {}
