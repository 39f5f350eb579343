"""Optimizer and learning-rate schedule of an unlearning run (a constructor argument of every objective)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

SCHEDULES = ("constant", "linear", "wsd")


@dataclass
class OptimizerConfig:
    """AdamW with an optional linear warmup, then a constant, linearly decaying or warmup-stable-decay rate.

    Args:
        lr: peak learning rate (LENS: 1e-5; Lacuna 1B SimNPO/OracleGrad: 1e-4, MemFlex: 3e-4).
        weight_decay: AdamW weight decay.
        betas: AdamW (β1, β2).
        warmup_steps: optimizer steps of linear warmup from 0 to ``lr``.
        schedule: ``"constant"`` keeps ``lr`` after warmup; ``"linear"`` decays it to 0 at the last step;
            ``"wsd"`` (warmup-stable-decay) keeps ``lr`` and then decays it linearly to 0 over the last
            ``decay_fraction`` of the run's steps.
        decay_fraction: the share of the run that ``"wsd"`` spends decaying, in (0, 1].
    """

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    schedule: str = "constant"
    decay_fraction: float = 0.3

    def __post_init__(self) -> None:
        if not math.isfinite(self.lr) or self.lr <= 0:
            raise ValueError(f"optim.lr must be a positive finite number, got {self.lr}; e.g. optim.lr: 1e-5.")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule={self.schedule!r} is not one of {SCHEDULES}.")
        if not math.isfinite(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}.")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}.")
        if not 0 < self.decay_fraction <= 1:
            raise ValueError(f"optim.decay_fraction must be in (0, 1], got {self.decay_fraction}.")
        self.betas = tuple(self.betas)

    def lr_factor(self, step: int, total_steps: int) -> float:
        """Multiplier of ``lr`` at optimizer step ``step`` (0-based) of ``total_steps``."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        if self.schedule == "wsd":
            decay = max(1, round(self.decay_fraction * total_steps))
            return min(1.0, max(0.0, (total_steps - step) / decay))
        remaining = max(1, total_steps - self.warmup_steps)
        return max(0.0, 1.0 - (step - self.warmup_steps) / remaining)

    def configure(self, params: Iterable[torch.nn.Parameter], total_steps: int) -> dict:
        """Lightning's ``configure_optimizers`` result: AdamW over ``params`` with this schedule, stepped per step.

        Args:
            params: the trainable parameters.
            total_steps: the run's optimizer steps (``trainer.estimated_stepping_batches``), for the decays.
        """
        optimizer = torch.optim.AdamW(list(params), lr=self.lr, weight_decay=self.weight_decay, betas=self.betas)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: self.lr_factor(step, total_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
