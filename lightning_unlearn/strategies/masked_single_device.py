"""Single-device strategy with per-sample masked gradients and restricted updates (see the package docstring)."""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_unlearn.strategies._masked_training import MaskedStrategyHooks, MaskedTraining, Masking


class MaskedSingleDeviceStrategy(MaskedStrategyHooks, SingleDeviceStrategy):
    """Lightning's single-device strategy plus the LightningModule contract of :mod:`lightning_unlearn.strategies`.

    Args:
        device: the device to train on, e.g. ``"cpu"`` or ``"cuda:0"``.
        masking: ``"auto"`` (one pass when every trainable module has a rule, else lockstep), ``"one_pass"``
            or ``"lockstep"``.
    """

    def __init__(self, device: str = "cpu", masking: Masking = "auto") -> None:
        super().__init__(device=torch.device(device))
        self.masked = MaskedTraining(masking)
