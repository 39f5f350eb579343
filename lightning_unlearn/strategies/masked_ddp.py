"""DDP strategy with per-sample masked gradients and restricted updates (see the package docstring).

DDP all-reduces (averages) the gradients each rank computed; masking is linear, so averaging locally masked
gradients is exact. Each rank's loss is the mean over its own samples, so the average over ranks is the global
per-sample mean when every rank gets the same number of samples per step (use a sampler that guarantees it).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.constants import default_pg_timeout
from typing_extensions import override

from lightning_unlearn.strategies._masked_training import MaskedTraining, Masking, backward_hooks_only


class MaskedDDPStrategy(DDPStrategy):
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
        self.masked = MaskedTraining(masking)

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        backward = lambda loss: self.precision_plugin.backward(loss, self.lightning_module, None)  # noqa: E731
        return self.masked.training_step(self.lightning_module, super().training_step, backward, args, kwargs)

    @override
    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.masked.grads_ready:
            return backward_hooks_only(self, closure_loss)
        return super().backward(closure_loss, optimizer, *args, **kwargs)

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        step = lambda c: super(MaskedDDPStrategy, self).optimizer_step(optimizer, c, model, **kwargs)  # noqa: E731
        return self.masked.optimizer_step(self.lightning_module, step, closure)
