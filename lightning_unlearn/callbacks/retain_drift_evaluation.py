"""Retain drift at every checkpoint: answer-token CE/PPL on retain data, ΔCE against the base, KL(p_base‖p_θ)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.callbacks.qa_records import encode_batch, forward_logits
from lightning_unlearn.callbacks.rank_split import map_batches
from lightning_unlearn.data.records import read_records
from lightning_unlearn.metrics.retain_drift import RetainDrift


def reference_logits(pl_module: LightningModule, batch: dict) -> torch.Tensor | None:
    """Base-model logits: the adapter disabled, or ``pl_module.reference_model``; ``None`` if neither exists."""
    model = pl_module.model
    if hasattr(model, "disable_adapter"):
        with model.disable_adapter():
            return forward_logits(model, batch)
    ref = getattr(pl_module, "reference_model", None)
    return forward_logits(ref, batch) if ref is not None else None


class RetainDriftEvaluation(CheckpointEvaluator):
    """CE, PPL, ΔCE and KL(p_base‖p_θ) on retain prompt/answer pairs (prompt tokens masked).

    The base CE is computed once (adapter disabled, or at step 0) and kept in the callback state. KL needs the
    base distribution at every checkpoint, so it is reported when the base is available then: a LoRA adapter
    (disabled for the base pass) or a ``reference_model`` on the module.

    Args:
        records: retain ``{prompt, answer}`` records or a file / datasets folder of them
            (:func:`~lightning_unlearn.data.records.read_records`).
        max_length: tokens per sequence.
        name: see :class:`CheckpointEvaluator`.
        output_dir: see :class:`CheckpointEvaluator`.
        batch_size: sequences per forward on each rank.
        prompt_key: column of the prompt (default ``prompt``; ``question`` is read when it is absent).
        answer_key: column of the answer.
        chat_template: render prompts with the tokenizer's chat template, as ``ForgetRetainDataModule`` does.
        current_is_base: in a ``validate`` that loads no checkpoint, the model evaluated is the base itself (e.g.
            the starting model of an unlearning run, for a "before" row): its CE is the base CE, ΔCE 0. Without
            it, such a ``validate`` of a full-fine-tuning model is refused, since nothing tells it which weights
            are the base.

    Raises:
        ValueError: no retain record, or a record without the prompt / answer column.
        FileNotFoundError: the records file does not exist.

    Example::

        >>> from lightning_unlearn.callbacks import RetainDriftEvaluation
        >>> drift = RetainDriftEvaluation([{"prompt": "Capital of France?", "answer": "Paris."}])
        >>> drift.family, len(drift.records)  # rows of family retain_drift over one record
        ('retain_drift', 1)
    """

    family = "retain_drift"

    def __init__(
        self,
        records: Sequence[dict] | str,
        max_length: int = 256,
        name: str | None = None,
        output_dir: str | None = None,
        batch_size: int = 8,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        chat_template: bool = False,
        current_is_base: bool = False,
    ) -> None:
        super().__init__(name=name, output_dir=output_dir, batch_size=batch_size)
        self.current_is_base = current_is_base
        self.records = read_records(records, what="retain records", prompt_key=prompt_key, answer_key=answer_key)
        self.chat_template = chat_template
        self.max_length = max_length

    def _drift(self, pl_module: LightningModule, with_reference: bool, base_ce: float | None) -> dict[str, float]:
        """Collective: :meth:`RetainDrift.summary` over every rank's share of the retain records."""
        drift = RetainDrift(base_ce=base_ce).to(pl_module.device)

        def forward(batch_records: list[dict]) -> tuple[dict, torch.Tensor, torch.Tensor | None]:
            batch = encode_batch(pl_module.tokenizer, batch_records, self.max_length, self.chat_template)
            logits = forward_logits(pl_module.model, batch)
            return batch, logits, reference_logits(pl_module, batch) if with_reference else None

        def run(batch_records: list[dict]) -> list[None]:
            batch, logits, base = forward(batch_records)
            drift.update(logits, batch["labels"], base)
            return []

        map_batches(self.records, self.batch_size, run, pl_module.model, self.progress, dummy=forward)
        return drift.summary()

    @override
    def compute_base(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        """Collective: the base model's answer-token CE on the retain records (ΔCE is measured against it).

        Args:
            trainer: the trainer.
            pl_module: the module evaluated; :meth:`base_context` makes its model the base.

        Returns:
            ``{"ce": float}``.
        """
        with self.base_context(pl_module, trainer):
            return {"ce": self._drift(pl_module, with_reference=False, base_ce=None)["ce"]}

    @override
    def compute(self, trainer: Trainer, pl_module: LightningModule, step: int) -> dict:
        """Collective: CE, PPL and ΔCE on the retain records, and KL(p_base‖p_θ) when a base is at hand.

        Args:
            trainer: the trainer.
            pl_module: the module evaluated (an adapter to disable or a ``reference_model`` gives the KL).
            step: the checkpoint's step.

        Returns:
            :meth:`~lightning_unlearn.metrics.retain_drift.RetainDrift.summary`.
        """
        has_reference = hasattr(pl_module.model, "disable_adapter") or getattr(pl_module, "reference_model", None)
        # ΔCE is against the stored base CE, computed once
        return self._drift(pl_module, with_reference=bool(has_reference), base_ce=self.base["ce"])
