"""DDP strategy with per-sample masked gradients and restricted updates (see the package docstring).

DDP all-reduces (averages) the gradients each rank computed; masking is linear, so averaging locally masked
gradients is exact. Each rank's loss is the mean over its own samples, so the average over ranks is the global
per-sample mean when every rank gets the same number of samples per step (use a sampler that guarantees it).
With gradient accumulation the earlier batches run in DDP's ``no_sync``; lockstep takes the accumulated gradients
out of ``.grad`` for its passes, so it averages them itself on the batch that syncs (one pass leaves them to DDP).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.constants import default_pg_timeout

from lightning_unlearn.strategies._masked_training import MaskedStrategyHooks, MaskedTraining, Masking


class MaskedDDPStrategy(MaskedStrategyHooks, DDPStrategy):
    """Lightning's DDP plus the LightningModule contract of :mod:`lightning_unlearn.strategies`.

    Args:
        process_group_backend: ``"gloo"`` for CPU, ``"nccl"`` for GPUs; ``None`` picks by accelerator.
        start_method: how Lightning launches the local processes (``"popen"`` re-runs the script).
        find_unused_parameters: passed to ``DistributedDataParallel``.
        masking: ``"auto"`` (one pass when every trainable module has a rule, else lockstep), ``"one_pass"``
            or ``"lockstep"``.
        timeout: collective timeout.
    """

    def __init__(
        self,
        process_group_backend: str | None = None,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        find_unused_parameters: bool = False,
        masking: Masking = "auto",
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        super().__init__(
            process_group_backend=process_group_backend,
            start_method=start_method,
            timeout=timeout,
            find_unused_parameters=find_unused_parameters,
        )
        self.masked = MaskedTraining(masking, sync_accumulated=self._sync_accumulated)

    def _sync_accumulated(self, gradients: list[torch.Tensor]) -> None:
        """Average over the ranks the gradients that earlier batches of an accumulation left local (they ran in
        ``no_sync``), when this batch is the one that syncs: what DDP's own backward does with them."""
        if not gradients or not getattr(self.model, "require_backward_grad_sync", False) or self.world_size == 1:
            return
        flat = torch.cat([g.reshape(-1) for g in gradients])
        dist.all_reduce(flat)
        flat.div_(self.world_size)
        offset = 0
        for g in gradients:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
