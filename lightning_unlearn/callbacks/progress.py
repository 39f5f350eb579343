"""The progress bar of ``lightning-unlearn fit``: Lightning's rich bar, described by epoch and optimizer step.

Lightning's bar reads ``Epoch 7/-2`` when a run is bounded by ``max_steps`` (Lightning sets ``max_epochs=-1``). This
one reads ``Epoch 7 · step 420/900`` (``Epoch 7/9`` when the run is bounded by epochs), through the bar's public task
API, so the bar itself is Lightning's.
"""

from __future__ import annotations

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar
from typing_extensions import override


def train_description(trainer: Trainer) -> str:
    """``Epoch E · step S/MAX`` for a step-bounded run, ``Epoch E/LAST`` for an epoch-bounded one."""
    text = f"Epoch {trainer.current_epoch}"
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return f"{text} · step {trainer.global_step}/{trainer.max_steps}"
    if trainer.max_epochs is not None and trainer.max_epochs > 0:
        return f"{text}/{trainer.max_epochs - 1}"
    return text


class StepProgressBar(RichProgressBar):
    """:class:`~lightning.pytorch.callbacks.RichProgressBar` whose training description is :func:`train_description`."""

    def _describe(self, trainer: Trainer) -> None:
        if self.progress is not None and getattr(self, "train_progress_bar_id", None) is not None:
            self.progress.update(self.train_progress_bar_id, description=train_description(trainer))

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Open the epoch's bar as Lightning does, then describe it by epoch and step (:func:`train_description`).

        Args:
            trainer: the trainer.
            pl_module: the module trained.
        """
        super().on_train_epoch_start(trainer, pl_module)
        self._describe(trainer)
        self.refresh()

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        """Update the description's step count, then advance the bar as Lightning does.

        Args:
            trainer: the trainer.
            pl_module: the module trained.
            outputs: the training step's output.
            batch: the batch.
            batch_idx: the batch's index.
        """
        self._describe(trainer)  # before the bar's own update, which redraws it
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
