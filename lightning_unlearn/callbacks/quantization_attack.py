"""The quantization attack at every checkpoint: the run's own evaluators again, on the weights rounded to int8 / int4.

Zhang et al. (ICLR 2025) find that unlearned models keep some of the forgotten knowledge below the quantization step:
rounded to 4 bits, they give much of it back. This callback asks that of every checkpoint a run saves (or ``evaluate``
scores after training): for each bit width it rounds the model's Linear weights
(:func:`~lightning_unlearn.quantization.quantized`), runs the other evaluation callbacks of the trainer on the rounded
model, restores the weights, and writes one row of family ``quantization_attack`` holding, per bit width, each
evaluator's metrics (``{"int4": {"sce": {...}, "memorization": {...}}, ...}``): the same numbers as the evaluators' own
rows, under the attack. Rows are written once per step and survive a resume like every evaluator's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.quantization import quantized

log = logging.getLogger("lightning_unlearn")

# Families that do not read the model's outputs (the weight change against the masks) or need a base pass the
# rounding would change; the attack leaves them out.
_NOT_ATTACKED = ("mask_auc",)


class EvaluatorAttack(CheckpointEvaluator):
    """Base of the attacks: run the trainer's other evaluators on an attacked model, their state left as it was.

    Args:
        families: the evaluator families to run under the attack (default: every evaluator of the trainer that
            reads the model's outputs).
        name: see :class:`CheckpointEvaluator`.
        output_dir: see :class:`CheckpointEvaluator`.
    """

    def __init__(self, families: Sequence[str] | None = None, name: str | None = None, output_dir: str | None = None):
        super().__init__(name=name, output_dir=output_dir)
        self.families = None if families is None else tuple(families)
        # evaluators of the run that are not callbacks of this trainer (set by `evaluate`, which leaves out the
        # families whose rows a step already has): the attack runs them too
        self.besides: list[CheckpointEvaluator] = []

    def _evaluators(self, trainer: Trainer) -> list[CheckpointEvaluator]:
        found = [
            cb
            for cb in [*trainer.callbacks, *self.besides]
            if isinstance(cb, CheckpointEvaluator) and not isinstance(cb, EvaluatorAttack)
            and cb.family not in _NOT_ATTACKED
        ]  # fmt: skip
        if self.families is not None:
            found = [cb for cb in found if cb.family in self.families or cb.family_name in self.families]
        if not found:
            raise ConfigError(
                f"{type(self).__name__} found no evaluator to run under the attack; add SCEEvaluation, "
                "MemorizationEvaluation or RetainDriftEvaluation to trainer.callbacks (or fix `families`)."
            )
        return found

    @staticmethod
    def evaluate_all(
        evaluators: Sequence[CheckpointEvaluator], trainer: Trainer, pl_module: LightningModule, step: int
    ) -> dict:
        """``{family: metrics}`` of each evaluator on the model as it is now; each evaluator's state is kept."""
        row: dict = {}
        for evaluator in evaluators:
            kept = dict(vars(evaluator))  # its own state (e.g. the answers it writes) stays its own
            try:
                row[evaluator.family_name] = evaluator.compute(trainer, pl_module, step)
            finally:
                vars(evaluator).clear()
                vars(evaluator).update(kept)
        return row


class QuantizationAttack(EvaluatorAttack):
    """The trainer's other evaluators on the model rounded to each of ``bits`` (round-to-nearest, symmetric).

    Args:
        bits: bit widths to attack with (default int8 and int4).
        group_size: weights of a row sharing one scale for widths below 8 (GPTQ / AWQ's group-wise int4, 128);
            int8 is per output channel. ``None``: per channel at every width.
        families: the evaluator families to run under the attack (default: every evaluator of the trainer that reads
            the model's outputs).
        name: see :class:`CheckpointEvaluator`.
        output_dir: see :class:`CheckpointEvaluator`.

    Under the attack, a LoRA run's retain-drift ``kl`` is left out: its reference pass (the adapter disabled) would
    read the rounded weights minus the adapter, not the base model. CE and ΔCE (against the stored base CE) stay.

    Raises:
        ValueError: a bit width outside 2–8, or no bit width.

    Example::

        >>> from lightning_unlearn.callbacks import QuantizationAttack
        >>> QuantizationAttack(bits=[4]).bits  # trainer.callbacks: [..., SCEEvaluation(...), QuantizationAttack()]
        (4,)
    """

    family = "quantization_attack"

    def __init__(
        self,
        bits: Sequence[int] = (8, 4),
        group_size: int | None = 128,
        families: Sequence[str] | None = None,
        name: str | None = None,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(families=families, name=name, output_dir=output_dir)
        if not bits or any(not 2 <= int(b) <= 8 for b in bits):
            raise ConfigError(f"bits={list(bits)}: give one or more widths from 2 to 8, e.g. [8, 4].")
        if group_size is not None and group_size < 1:
            raise ConfigError(f"group_size={group_size} must be positive, or null for per-channel scales.")
        self.bits = tuple(int(b) for b in bits)
        self.group_size = group_size

    @override
    def compute(self, trainer: Trainer, pl_module: LightningModule, step: int) -> dict:
        """Collective: every attacked evaluator's metrics on the model rounded to each bit width in turn.

        The base quantities come from the unrounded model; the weights are restored after each width.

        Args:
            trainer: the trainer whose other evaluators run.
            pl_module: the module whose ``model`` is rounded.
            step: the checkpoint's step.

        Returns:
            ``{"int<bits>": {family: metrics, "weights_rounded": n, "group_size": g}}`` per bit width.

        Raises:
            ValueError: the trainer has no evaluator to attack (from ``_evaluators``).
        """
        evaluators = self._evaluators(trainer)
        for evaluator in evaluators:  # base quantities come from the unrounded model
            evaluator.ensure_base(trainer, pl_module)
        lora = hasattr(pl_module.model, "disable_adapter")
        out: dict = {}
        for bits in self.bits:
            size = self.group_size if bits < 8 else None
            if trainer.is_global_zero:
                log.info("[quantization attack] checkpoint %d: int%d; evaluating %s", step, bits,
                         ", ".join(e.family_name for e in evaluators))  # fmt: skip
            with quantized(pl_module.model, bits, size) as rounded:
                row = self.evaluate_all(evaluators, trainer, pl_module, step)
            for evaluator in evaluators:
                if lora and evaluator.family == "retain_drift":
                    row[evaluator.family_name].pop("kl", None)
            row["weights_rounded"] = rounded
            row["group_size"] = size
            out[f"int{bits}"] = row
        return out
