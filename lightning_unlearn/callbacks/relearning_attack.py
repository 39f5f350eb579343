"""The relearning attack at every checkpoint: a few fine-tuning steps on related data, then the run's evaluators.

Forgetting that only hides comes back after a little relearning (Lacuna Sec. 4.3; EleutherAI's fine-tune attack,
TamperBench). At each checkpoint this callback copies the trainable weights (the LoRA adapter, or every weight of a full
fine-tuning run), trains them with AdamW on answer-token NLL of ``records`` (the forget set's held-out part, or
related text), runs the trainer's other evaluators after each number of ``steps`` (a recovery curve), and puts every
weight back, so the run itself continues as if nothing happened. One row of family ``relearning_attack`` per checkpoint:
``{"after_10": {"sce": {...}, "memorization": {...}, "loss": …}, "after_30": {...}}``, once across resumes.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

import torch
from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.callbacks.qa_records import encode_batch
from lightning_unlearn.callbacks.quantization_attack import EvaluatorAttack
from lightning_unlearn.data.records import read_records
from lightning_unlearn.errors import ConfigError

log = logging.getLogger("lightning_unlearn")


class RelearningAttack(EvaluatorAttack):
    """The trainer's other evaluators after ``steps`` steps of relearning ``records`` from each checkpoint.

    Args:
        records: ``{prompt, answer}`` records to relearn, or a file / datasets folder of them
            (:func:`~lightning_unlearn.data.records.read_records`): never the forget set itself, which measures
            nothing but memorization of what it was just shown.
        steps: numbers of relearning steps after which the evaluators run (the curve's points), e.g. ``[10, 30]``.
        lr: AdamW learning rate of the relearning.
        batch_size: records per relearning step (drawn without replacement in a seeded order, cycling).
        max_length: tokens per relearned sequence.
        chat_template: render prompts with the tokenizer's chat template, as the run's data module does.
        seed: the order of the records (the same at every checkpoint).
        families: see :class:`EvaluatorAttack`.
        name: see :class:`~lightning_unlearn.callbacks.CheckpointEvaluator`.
        output_dir: see :class:`~lightning_unlearn.callbacks.CheckpointEvaluator`.

    Raises:
        ValueError: no steps, a step below 1, a learning rate that is not positive, or no records.

    Example::

        >>> from lightning_unlearn.callbacks import RelearningAttack
        >>> attack = RelearningAttack([{"prompt": "Who?", "answer": "Alice."}], steps=[30, 10])
        >>> attack.steps  # trainer.callbacks: [..., MemorizationEvaluation(...), attack]
        (10, 30)
    """

    family = "relearning_attack"

    def __init__(
        self,
        records: Sequence[dict] | str,
        steps: Sequence[int] = (10, 30),
        lr: float = 1e-4,
        batch_size: int = 4,
        max_length: int = 256,
        chat_template: bool = False,
        seed: int = 0,
        families: Sequence[str] | None = None,
        name: str | None = None,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(families=families, name=name, output_dir=output_dir)
        if not steps or any(int(s) < 1 for s in steps):
            raise ConfigError(f"steps={list(steps)}: give one or more numbers of relearning steps, each at least 1.")
        if not lr > 0:
            raise ConfigError(f"lr={lr} must be positive, e.g. 1e-4.")
        self.records = read_records(records, what="relearning records")
        self.steps = tuple(sorted({int(s) for s in steps}))
        self.lr, self.relearn_batch_size, self.max_length = lr, batch_size, max_length
        self.chat_template, self.seed = chat_template, seed
        # the suite levels the records answer (a LENS record's `level`): SCE read on the other levels is the clean
        # reading of the attack (the relearned questions' own answers are memorization, not recovery)
        self.relearned_levels = tuple(sorted({str(r["level"]) for r in self.records if r.get("level")}))

    def _batches(self):
        rng = random.Random(self.seed)
        while True:
            order = list(range(len(self.records)))
            rng.shuffle(order)
            for start in range(0, len(order), self.relearn_batch_size):
                yield [self.records[i] for i in order[start : start + self.relearn_batch_size]]

    @override
    def compute(self, trainer: Trainer, pl_module: LightningModule, step: int) -> dict:
        """The attacked evaluators' metrics after each number of relearning steps; the weights are restored after.

        Trains a copy of the trainable weights with AdamW on ``records``' answer NLL (one process only).

        Args:
            trainer: the trainer whose other evaluators run.
            pl_module: the module whose trainable weights are relearned.
            step: the checkpoint's step.

        Returns:
            ``{"after_<n>": {family: metrics, "relearning_loss": float}, "records": count}``.

        Raises:
            ValueError: more than one process, or no trainable weight in the model.
        """
        evaluators = self._evaluators(trainer)
        for evaluator in evaluators:  # base quantities come from the model before the attack
            evaluator.ensure_base(trainer, pl_module)
        model = pl_module.model
        if trainer.world_size > 1:
            raise ConfigError(
                "the relearning attack trains a copy of the weights in one process (under DDP its backward would "
                "meet the gradient hooks, under FSDP the shards); run it after training on one process: "
                "`lightning-unlearn evaluate RUN_DIR -c attack.yaml`."
            )
        trainable = [p for p in model.parameters() if p.requires_grad]
        if not trainable:
            raise ConfigError("the relearning attack found no trainable weight (requires_grad) in the model.")
        saved = [p.detach().clone() for p in trainable]
        grads = [p.grad for p in trainable]
        optimizer = torch.optim.AdamW(trainable, lr=self.lr)
        device = trainable[0].device
        batches = self._batches()
        out: dict = {}
        done, loss = 0, None
        try:
            for target in self.steps:
                # `evaluate` and `validate` run the callbacks under inference mode, where enable_grad alone records
                # nothing
                with torch.inference_mode(False), torch.enable_grad():
                    while done < target:
                        encoded = encode_batch(pl_module.tokenizer, next(batches), self.max_length, self.chat_template)
                        batch = {k: v.to(device) for k, v in encoded.items()}
                        optimizer.zero_grad(set_to_none=True)
                        loss = model(**batch).loss
                        loss.backward()
                        optimizer.step()
                        done += 1
                if trainer.is_global_zero:
                    log.info("[relearning attack] checkpoint %d: %d relearning steps (loss %.3f); evaluating %s",
                             step, done, float(loss), ", ".join(e.family_name for e in evaluators))  # fmt: skip
                row = self.evaluate_all(evaluators, trainer, pl_module, step)
                row["relearning_loss"] = float(loss)
                for evaluator in evaluators:
                    unrelearned = self.unrelearned_reading(evaluator, row.get(evaluator.family_name))
                    if unrelearned is not None:
                        row[evaluator.family_name]["pooled_unrelearned"] = unrelearned
                out[f"after_{target}"] = row
        finally:
            with torch.no_grad():
                for p, original, grad in zip(trainable, saved, grads):
                    p.copy_(original)
                    p.grad = grad
        out["records"] = len(self.records)
        if self.relearned_levels:
            out["relearned_levels"] = list(self.relearned_levels)
        return out

    def unrelearned_reading(self, evaluator: CheckpointEvaluator, metrics: dict | None) -> dict | None:
        """An SCE evaluator's B, A and s pooled over its selection levels minus :attr:`relearned_levels` (``None``
        when the records name no level, the evaluator pools no levels, or nothing is left)."""
        pooled_levels = getattr(evaluator, "selection_levels", None)
        if not self.relearned_levels or not pooled_levels or not isinstance(metrics, dict):
            return None
        kept = [lv for lv in pooled_levels if lv not in self.relearned_levels and lv in (metrics.get("levels") or {})]
        b = sum(int(metrics["levels"][lv].get("B") or 0) for lv in kept)
        a = sum(int(metrics["levels"][lv].get("A") or 0) for lv in kept)
        if not kept or b == 0:
            return None
        return {"levels": kept, "B": b, "A": a, "s": (b - a) / b}
