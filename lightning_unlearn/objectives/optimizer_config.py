"""Optimizer and learning-rate schedule of an unlearning run (a constructor argument of every objective)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from lightning_unlearn.errors import ConfigError

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
        cycles: run the schedule in restarts: ``[[steps, multiplier], ...]``, each cycle ``steps`` long with its
            own warmup and ``schedule`` at ``lr · multiplier`` (AdamW's moments carry over), as a second phase of
            training started from the first one's weights at a new rate (docs/results/lacuna_memorization.md §9e); the
            cycles' steps must add up to the run's steps. ``None`` = one cycle, the whole run.
        fused: AdamW's fused kernel (torch's ``fused=True``, CPU and CUDA parameters): one pass over every
            parameter instead of a loop of element-wise ops per tensor. On a 2-core CPU an AdamW step took
            0.37-0.40× the loop's time, at the Lacuna θ_pre's 27 M parameters and at SmolLM2's 135 M
            (``benchmarks/adamw_step.py``). Its rounding differs from the loop's by about an ulp, so a run with it is
            not bit for bit the run without.
    """

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    schedule: str = "constant"
    decay_fraction: float = 0.3
    cycles: list[tuple[int, float]] | None = None
    fused: bool = False

    def __post_init__(self) -> None:
        if not math.isfinite(self.lr) or self.lr <= 0:
            raise ConfigError(f"optim.lr must be a positive finite number, got {self.lr}; e.g. optim.lr: 1e-5.")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"optim.schedule={self.schedule!r} is not one of {SCHEDULES}.")
        if not math.isfinite(self.weight_decay) or self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay must be >= 0, got {self.weight_decay}.")
        if self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}.")
        if not 0 < self.decay_fraction <= 1:
            raise ConfigError(f"optim.decay_fraction must be in (0, 1], got {self.decay_fraction}.")
        self.betas = tuple(self.betas)
        if self.cycles is not None:
            cycles = [tuple(c) for c in self.cycles]
            bad = [c for c in cycles if len(c) != 2 or int(c[0]) != c[0] or c[0] < 1 or not 0 < c[1] < math.inf]
            if not cycles or bad:
                raise ConfigError(
                    f"optim.cycles={self.cycles!r}: give [[steps, lr multiplier], ...] with steps >= 1 and a positive "
                    "multiplier, e.g. [[1200, 1.0], [400, 0.5]]."
                )
            self.cycles = [(int(n), float(m)) for n, m in cycles]

    def check_steps(self, total_steps: int) -> None:
        """Refuse cycles that do not add up to the run's optimizer steps."""
        if self.cycles is not None and sum(n for n, _ in self.cycles) != total_steps:
            raise ConfigError(
                f"optim.cycles add up to {sum(n for n, _ in self.cycles)} steps, but the run has {total_steps}; "
                "make the cycles' steps add up to trainer.max_steps."
            )

    def lr_factor(self, step: int, total_steps: int) -> float:
        """Multiplier of ``lr`` at optimizer step ``step`` (0-based) of ``total_steps``."""
        if self.cycles is not None:
            for steps, multiplier in self.cycles:
                if step < steps:
                    return multiplier * self._cycle_factor(step, steps)
                step -= steps
            return 0.0  # past the last cycle (Lightning may step the scheduler once more at the end)
        return self._cycle_factor(step, total_steps)

    def _cycle_factor(self, step: int, total_steps: int) -> float:
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
        self.check_steps(total_steps)
        kwargs = {"fused": True} if self.fused else {}  # None would let torch choose (foreach on CUDA)
        optimizer = torch.optim.AdamW(
            list(params), lr=self.lr, weight_decay=self.weight_decay, betas=self.betas, **kwargs
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: self.lr_factor(step, total_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
