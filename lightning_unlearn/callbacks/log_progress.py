"""Training progress as periodic log lines, for runs whose output goes to a file (SLURM, nohup, a sweep's cell log).

A progress bar redraws one terminal line; written to a file it shows nothing until the end (Rich) or a wall of
carriage returns (tqdm), so a slow machine cannot be told from a hung one. This callback logs, on rank 0, through
``logging.getLogger("lightning_unlearn")``, one line every ``every_seconds`` and one when training ends:

    fit: step 120/900 (13 %) · epoch 0 · 1.42 s/step · about 18 min left · train/loss 2.314

``lightning-unlearn fit`` adds it when standard output is not a terminal or the progress bar is turned off.
"""

from __future__ import annotations

import logging
import time

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

log = logging.getLogger("lightning_unlearn")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class LogProgress(Callback):
    """Log training progress every ``every_seconds`` (rank 0), and once at the end of training.

    Args:
        every_seconds: seconds between two lines (the first comes after the first step past it).
        metric: a logged metric to show with each line (``trainer.callback_metrics``); ``None``: none.
    """

    def __init__(self, every_seconds: float = 60.0, metric: str | None = "train/loss") -> None:
        if not every_seconds > 0:
            raise ValueError(f"every_seconds={every_seconds} must be positive.")
        self.every_seconds = every_seconds
        self.metric = metric
        self._start: float | None = None
        self._start_step = 0
        self._last: float = 0.0

    def line(self, trainer: Trainer, now: float) -> str:
        """The progress line at time ``now`` (``time.monotonic()``)."""
        step, total = trainer.global_step, trainer.max_steps
        parts = [f"fit: step {step}" + (f"/{total} ({100 * step / total:.0f} %)" if total and total > 0 else "")]
        parts.append(f"epoch {trainer.current_epoch}")
        done = step - self._start_step
        if done > 0 and self._start is not None:
            per_step = (now - self._start) / done
            parts.append(f"{per_step:.2f} s/step")
            if total and total > step:
                parts.append(f"about {_duration(per_step * (total - step))} left")
        value = trainer.callback_metrics.get(self.metric) if self.metric else None
        if value is not None:
            parts.append(f"{self.metric} {float(value):.4g}")
        return " · ".join(parts)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start = self._last = time.monotonic()
        self._start_step = trainer.global_step  # a resumed run measures its own pace
        if trainer.is_global_zero:
            log.info("fit: training from step %d%s", trainer.global_step,
                     f" to {trainer.max_steps}" if trainer.max_steps and trainer.max_steps > 0 else "")  # fmt: skip

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        now = time.monotonic()
        if trainer.is_global_zero and now - self._last >= self.every_seconds:
            self._last = now
            log.info(self.line(trainer, now))

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            log.info("%s · done", self.line(trainer, time.monotonic()))
