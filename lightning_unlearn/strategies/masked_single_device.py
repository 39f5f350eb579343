"""Single-device strategy with per-sample masked gradients and restricted updates (see the package docstring)."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import SingleDeviceStrategy
from typing_extensions import override

from lightning_unlearn.strategies._masked_training import MaskedTraining, Masking, backward_hooks_only


class MaskedSingleDeviceStrategy(SingleDeviceStrategy):
    """Lightning's single-device strategy plus the LightningModule contract of :mod:`lightning_unlearn.strategies`.

    Args:
        device: the device to train on, e.g. ``"cpu"`` or ``"cuda:0"``.
        masking: ``"auto"`` (one pass when every trainable module has a rule, else lockstep), ``"one_pass"``
            or ``"lockstep"``.
    """

    def __init__(self, device: str = "cpu", masking: Masking = "auto") -> None:
        super().__init__(device=torch.device(device))
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
        step = lambda c: super(MaskedSingleDeviceStrategy, self).optimizer_step(optimizer, c, model, **kwargs)  # noqa: E731
        return self.masked.optimizer_step(self.lightning_module, step, closure)
