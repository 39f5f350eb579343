"""Multiple-choice utility at every checkpoint: accuracy by option log-likelihood."""

from __future__ import annotations

from collections.abc import Sequence

from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.callbacks.rank_split import map_batches
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.metrics.utility import (
    load_multiple_choice,
    multiple_choice_accuracy,
    normalize_item,
    option_logprobs,
)


class UtilityEvaluation(CheckpointEvaluator):
    """Accuracy on ``{question, choices, answer}`` items; the predicted option has the highest log-likelihood.

    Args:
        items: a JSONL file of items or a list of them.
        length_normalize: score options by mean instead of summed token log-probability.
        max_length: tokens per question+option sequence.
        name: see :class:`CheckpointEvaluator` (e.g. ``mmlu``, ``belebele``).
        output_dir: see :class:`CheckpointEvaluator`.
        batch_size: items per forward on each rank (each item is one sequence per choice).

    Raises:
        ValueError: no item, or an item without question, choices (two or more) or a valid answer.

    Example::

        >>> from lightning_unlearn.callbacks import UtilityEvaluation
        >>> utility = UtilityEvaluation([{"question": "2 + 2 =", "choices": ["3", "4"], "answer": "B"}])
        >>> utility.items[0]["answer"]  # a letter answer becomes its 0-based choice index
        1
    """

    family = "utility"

    def __init__(
        self,
        items: Sequence[dict] | str,
        length_normalize: bool = False,
        max_length: int = 256,
        name: str | None = None,
        output_dir: str | None = None,
        batch_size: int = 8,
    ) -> None:
        super().__init__(name=name, output_dir=output_dir, batch_size=batch_size)
        if isinstance(items, str):
            self.items = load_multiple_choice(items)
        else:
            self.items = [normalize_item(it, where=f"item {i}") for i, it in enumerate(items)]
            if not self.items:
                raise ConfigError("UtilityEvaluation got no items.")
        self.length_normalize = length_normalize
        self.max_length = max_length

    def _accuracy(self, pl_module: LightningModule) -> float:
        def run(batch: list[dict]) -> list[list[float]]:
            return option_logprobs(
                pl_module.model,
                pl_module.tokenizer,
                batch,
                batch_size=10**6,
                max_length=self.max_length,
                length_normalize=self.length_normalize,
            )

        scores = map_batches(self.items, self.batch_size, run, pl_module.model, self.progress)
        return multiple_choice_accuracy(scores, [it["answer"] for it in self.items])

    @override
    def compute_base(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        """Collective: the base model's accuracy (``None`` when there is no base model to ask).

        Args:
            trainer: the trainer.
            pl_module: the module evaluated; :meth:`base_context` makes its model the base.

        Returns:
            ``{"accuracy": float | None}``.
        """
        # The base accuracy makes the utility delta that the guarded checkpoint selection bounds. A full
        # fine-tuning run validated past step 0 has no base model to ask; it then reports accuracy only.
        try:
            context = self.base_context(pl_module, trainer)
        except RuntimeError:
            return {"accuracy": None}
        with context:
            return {"accuracy": self._accuracy(pl_module)}

    @override
    def compute(self, trainer: Trainer, pl_module: LightningModule, step: int) -> dict:
        """Collective: multiple-choice accuracy of the current weights and its change from the base.

        Args:
            trainer: the trainer.
            pl_module: the module whose ``model`` answers.
            step: the checkpoint's step.

        Returns:
            ``{"accuracy", "num_items", "base_accuracy", "delta_accuracy"}`` (the delta when the base is known).
        """
        accuracy = self._accuracy(pl_module)
        base = self.base.get("accuracy")
        out = {"accuracy": accuracy, "num_items": len(self.items), "base_accuracy": base}
        if base is not None:
            out["delta_accuracy"] = accuracy - base
        return out
