"""The protocol by which callbacks learn that :class:`~lightning_unlearn.callbacks.StopRule` ended a run."""

from __future__ import annotations

from abc import ABC, abstractmethod

from lightning.pytorch import LightningModule, Trainer


class StopListener(ABC):
    """A callback that keeps something per checkpoint step (files, evaluation rows, a selection) and must drop what
    belongs to the steps a stop discards.

    Listed after ``Callback`` in the bases (``class CheckpointEvaluator(Callback, StopListener)``). When the stop rule
    fires, :class:`~lightning_unlearn.callbacks.StopRule` calls :meth:`on_run_stopped` on every such callback in
    ``trainer.callbacks``, in that list's order (evaluators before ``CheckpointSelection`` before the checkpoint
    callbacks, which Lightning keeps last).
    """

    @abstractmethod
    def on_run_stopped(self, trainer: Trainer, pl_module: LightningModule, bad_step: int, reason: str) -> None:
        """The weights of step ``bad_step`` were made by a bad update: keep nothing of that step or later.

        Called on every rank, from the training step whose loss showed it (before its backward), so every rank may
        enter a collective here; ``reason`` says which rule fired.
        """
