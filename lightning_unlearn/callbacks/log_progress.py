"""Training progress as periodic log lines, for runs whose output goes to a file (SLURM, nohup, a sweep's cell log).

A progress bar redraws one terminal line; written to a file it shows nothing until the end (Rich) or a wall of
carriage returns (tqdm), so a slow machine cannot be told from a hung one. This callback logs, on rank 0, through
``logging.getLogger("lightning_unlearn")``, one line each time training passes another ``every_percent`` of its
steps or ``every_seconds`` after the last line, and one when training ends:

    fit: step 120/900 (13 %) · epoch 0 · 1.42 s/step · about 18 min left · train/loss 2.314

The total is the steps the epochs come to, capped by ``max_steps`` (``trainer.estimated_stepping_batches``).

``lightning-unlearn fit`` adds it when standard output is not a terminal or the progress bar is turned off.
"""

from __future__ import annotations

import logging
import math
import time

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_unlearn.errors import ConfigError

log = logging.getLogger("lightning_unlearn")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class LogProgress(Callback):
    """Log training progress (rank 0) every ``every_percent`` of the steps or ``every_seconds``, and at the end.

    Args:
        every_percent: a line each time the step count passes another this much of the total (when it is known).
        every_seconds: at most this many seconds between two lines (the first comes after the first step past it).
        metric: a logged metric to show with each line (``trainer.callback_metrics``); ``None``: none.

    Raises:
        ValueError: ``every_percent`` or ``every_seconds`` not positive.

    Example::

        >>> from lightning_unlearn.callbacks import LogProgress
        >>> LogProgress(every_percent=10).every_percent  # `fit` adds LogProgress() when its output is a file
        10
    """

    def __init__(
        self, every_percent: float = 5.0, every_seconds: float = 60.0, metric: str | None = "train/loss"
    ) -> None:
        if not every_seconds > 0 or not every_percent > 0:
            raise ConfigError(f"every_percent={every_percent} and every_seconds={every_seconds} must both be positive.")
        self.every_percent = every_percent
        self.every_seconds = every_seconds
        self.metric = metric
        self._start: float | None = None
        self._start_step = 0
        self._last: float = 0.0
        self._last_share = -1  # the last multiple of every_percent a line was written at

    @staticmethod
    def total_steps(trainer: Trainer) -> int | None:
        """The run's total optimizer steps (``trainer.estimated_stepping_batches``: the epochs' steps, capped by
        ``max_steps``), else ``max_steps``; ``None`` when neither is known."""
        try:
            total = trainer.estimated_stepping_batches
        except Exception:  # noqa: BLE001 - e.g. an iterable dataset without a length: fall back to max_steps
            total = None
        if isinstance(total, int | float) and math.isfinite(total) and total > 0:
            return int(total)
        return trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None

    def line(self, trainer: Trainer, now: float) -> str:
        """The progress line at time ``now`` (``time.monotonic()``)."""
        step, total = trainer.global_step, self.total_steps(trainer)
        parts = [f"fit: step {step}" + (f"/{total} ({100 * step / total:.0f} %)" if total else "")]
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
        """Start the clock at the (possibly resumed) step and log the step range on rank 0.

        Args:
            trainer: the trainer.
            pl_module: the module about to be trained.
        """
        self._start = self._last = time.monotonic()
        self._start_step = trainer.global_step  # a resumed run measures its own pace
        total = self.total_steps(trainer)
        if total:
            self._last_share = int(100 * trainer.global_step / total // self.every_percent)
        if trainer.is_global_zero:
            log.info("fit: training from step %d%s", trainer.global_step, f" to {total}" if total else "")

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        """Log a progress line on rank 0 when another ``every_percent`` is passed or ``every_seconds`` have gone by.

        Args:
            trainer: the trainer.
            pl_module: the module trained.
            outputs: the training step's output (unused).
            batch: the batch (unused).
            batch_idx: the batch's index (unused).
        """
        now = time.monotonic()
        total = self.total_steps(trainer)
        share = int(100 * trainer.global_step / total // self.every_percent) if total else self._last_share
        if trainer.is_global_zero and (share > self._last_share or now - self._last >= self.every_seconds):
            self._last, self._last_share = now, share
            log.info(self.line(trainer, now))

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log the final progress line, ending in ``· done``, on rank 0.

        Args:
            trainer: the trainer.
            pl_module: the module trained.
        """
        if trainer.is_global_zero:
            log.info("%s · done", self.line(trainer, time.monotonic()))
