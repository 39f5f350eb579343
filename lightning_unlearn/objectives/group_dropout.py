"""Group dropout for masked injection: for one batch, set a random subset of the *other* groups' injected changes
back to θ_pre, then put them back before the optimizer step.

Why: trained jointly, six groups' changes co-adapt. Each group's recall comes to lean on every other group's change, so
resetting one group's mask elements to θ_pre (the testbed's ground-truth check) makes every group forget
(docs/results/lacuna_memorization.md §9). Training each group's batch with the other groups' changes present or absent
at random (each dropped with probability ``p``, independently) makes every group's recall hold either way, as dropout
makes units robust to their neighbours' absence. Only the batch's own group receives gradient (the masked strategy), so
a group's people are stored in its own mask and nowhere else.

The batch must hold one group (``InjectionDataModule(one_group_per_batch=True)``); neutral rows (group −1) are never
dropped from. The dropped set is a function of ``(seed, global step)``, the same on every rank and on a resumed run.
Works on plain parameters and on FSDP2's dim-0 shards (each rank swaps its own rows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from lightning_unlearn.distributed import local_view
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.masks import canonical_name, group_mask


def dropout_schedule(p: float | Sequence[Sequence[float]]) -> list[tuple[int, float]]:
    """``p`` as ``[(from_step, probability), ...]``: a number is that probability from step 0; a schedule
    ``[[0, 1.0], [1200, 0.5]]`` drops every other group for the first 1200 steps (each group trained alone), then
    each with probability ½ (each group trained with the others present or not). Steps start at 0 and increase."""
    if isinstance(p, (int, float)):
        schedule = [(0, float(p))]
    else:
        try:
            schedule = [(int(step), float(q)) for step, q in p]
            ok = all(int(step) == step for step, _ in p)
        except (TypeError, ValueError):
            schedule, ok = [], False
        ok = ok and bool(schedule) and schedule[0][0] == 0
        ok = ok and all(a[0] < b[0] for a, b in zip(schedule, schedule[1:]))
        if not ok:
            raise ConfigError(
                f"drop_other_groups={p!r}: give a probability or a schedule [[0, p0], [step, p1], ...] whose steps "
                "start at 0 and increase, e.g. [[0, 1.0], [1200, 0.5]]."
            )
    for _, q in schedule:
        if not 0 <= q <= 1:
            raise ConfigError(f"drop_other_groups={p!r}: {q} is not a probability in [0, 1].")
    return schedule


class GroupDropout:
    """Swap dropped groups' mask elements to θ_pre and back.

    Args:
        pre_weights: θ_pre, ``{canonical name: full tensor}`` (``models.load_weights`` of the starting model; read
            from disk, so a resumed run and every FSDP rank get θ_pre whatever their parameters hold).
        packed_masks: ``{canonical name: uint32 packed mask of the full parameter}`` (may be lazy).
        num_groups: groups in the masks.
        p: probability of dropping each other group for a batch, or a schedule of it (:func:`dropout_schedule`).
        seed: seed of the draws.
    """

    def __init__(
        self,
        pre_weights: Mapping[str, torch.Tensor],
        packed_masks: Mapping[str, torch.Tensor],
        num_groups: int,
        p: float | Sequence[Sequence[float]],
        seed: int = 0,
    ) -> None:
        self.schedule = dropout_schedule(p)
        self.seed, self.num_groups = seed, num_groups
        # Per parameter and group: flat indices (full tensor) of the group's elements and their θ_pre values, split
        # once here so that a step's drop is a gather and a scatter per dropped group (no selection per step).
        self._full: dict[str, tuple[tuple[int, ...], dict[int, tuple[torch.Tensor, torch.Tensor]]]] = {}
        for name, packed in packed_masks.items():
            pre_flat = pre_weights[name].reshape(-1)
            per_group = {}
            for g in range(num_groups):
                flat = group_mask(packed, g).reshape(-1).nonzero().squeeze(1)
                if flat.numel():
                    per_group[g] = (flat, pre_flat[flat].float().clone())
            if per_group:
                self._full[name] = (tuple(packed.shape), per_group)
        self._local: dict[str, tuple[torch.Tensor, dict[int, tuple[torch.Tensor, torch.Tensor]]]] | None = None
        self._saved: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def _localize(self, model: nn.Module) -> None:
        """This rank's share: indices into the local (shard) view of each parameter."""
        self._local = {}
        for name, q in ((canonical_name(n), q) for n, q in model.named_parameters()):
            if name not in self._full:
                continue
            shape, per_group = self._full[name]
            local = local_view(q)
            start = stop = None
            if tuple(local.shape) != shape:  # an FSDP2 dim-0 shard: torch.chunk's rows of this rank
                rows, row = shape[0], int(torch.tensor(shape[1:]).prod()) if len(shape) > 1 else 1
                placement = q.placements[0] if hasattr(q, "placements") else None
                if placement is None or not placement.is_shard(0):
                    raise ConfigError(f"group dropout supports dim-0 shards only; {name!r} is {placement}.")
                per = -(-rows // q.device_mesh.size())
                first = per * q.device_mesh.get_local_rank()
                start, stop = first * row, min(first + per, rows) * row
            groups = {}
            for g, (flat, pre) in per_group.items():
                if start is not None:
                    keep = (flat >= start) & (flat < stop)
                    flat, pre = flat[keep] - start, pre[keep]
                if flat.numel():
                    groups[g] = (flat.to(local.device), pre.to(local.device, local.dtype))
            self._local[name] = (local, groups)

    def p_at(self, step: int) -> float:
        """The dropout probability at ``step``."""
        return [q for start, q in self.schedule if start <= step][-1]

    def drawn(self, step: int, present: set[int]) -> list[int]:
        """The groups dropped at ``step``: each group not in ``present`` with probability :meth:`p_at`."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        draws = torch.rand(self.num_groups, generator=gen).tolist()
        p = self.p_at(step)
        return [g for g in range(self.num_groups) if g not in present and draws[g] < p]

    @torch.no_grad()
    def drop(self, model: nn.Module, groups: list[int]) -> None:
        """Set ``groups``' elements to θ_pre (remembering the current values)."""
        if self._saved:
            raise RuntimeError("group dropout: drop() called twice without restore().")
        if not groups:
            return
        if self._local is None:
            self._localize(model)
        for local, per_group in self._local.values():
            view = local.data.view(-1)
            for g in groups:
                if g in per_group:
                    index, pre = per_group[g]
                    self._saved.append((view, index, view[index]))
                    view[index] = pre

    @torch.no_grad()
    def restore(self) -> None:
        """Put the dropped elements' current values back."""
        for view, index, values in reversed(self._saved):  # last saved first: right even if groups overlap
            view[index] = values
        self._saved = []
