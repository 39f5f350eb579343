"""GA-Retain (Yao et al. 2024, "Large Language Model Unlearning"; LENS Sec. 5).

L = w_f·(−NLL̄(forget)) + w_r·NLL̄(forget prompt, random retain answer) + w_n·KL(p_ref ‖ p_θ) on retain text.
The random-answer pairs come from ``ForgetRetainDataModule(random_answers=True)`` as ``batch["mismatch"]``.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_unlearn.losses import KL_POSITIONS, check_choice, ga_retain_loss, kl_divergence, normalized_nll
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule, nonnegative_weights


class GARetain(UnlearningModule):
    """Gradient ascent with a random-answer term and a KL anchor to the start model on retain text.

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        forget_weight: w_f (Yao et al.: 0.5).
        random_weight: w_r (1).
        kl_weight: w_n (1).
        kl_positions: ``answer`` (default: the retain answer's positions) or ``all`` (every non-padding position,
            prompt included, as OpenUnlearning's KL term).

    Raises:
        ValueError: a negative or non-finite weight, or an unknown ``kl_positions``.

    Example::

        >>> from lightning_unlearn.objectives import GARetain
        >>> # checked before any model is read
        >>> GARetain("models/start", kl_weight=-1.0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_unlearn.errors.ConfigError: kl_weight=-1.0 must be a finite weight >= 0 ...
    """

    needs_reference = True

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        collapse_fraction: float | None = None,
        forget_weight: float = 0.5,
        random_weight: float = 1.0,
        kl_weight: float = 1.0,
        kl_positions: str = "answer",
    ) -> None:
        nonnegative_weights(forget_weight=forget_weight, random_weight=random_weight, kl_weight=kl_weight)
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        check_choice("kl_positions", kl_positions, KL_POSITIONS)
        self.save_hyperparameters()
        self.kl_positions = kl_positions
        self.forget_weight = forget_weight
        self.random_weight = random_weight
        self.kl_weight = kl_weight

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = w_f·(−NLL̄(forget)) + w_r·NLL̄(forget prompt, random answer) + w_n·KL(p_ref ‖ p_θ) on retain text.

        Args:
            batch: ``{"forget", "retain", "mismatch"}`` LM batches; ``mismatch`` pairs forget prompts with random
                retain answers.

        Returns:
            ``(loss, {"forget_nll", "retain_nll", "retain_kl"})``.

        Raises:
            KeyError: the batch has no ``"mismatch"`` part (``ForgetRetainDataModule(random_answers=True)``).
        """
        if "mismatch" not in batch:
            raise KeyError(
                "GARetain needs forget prompts with random retain answers: set random_answers: true on "
                "ForgetRetainDataModule."
            )
        f_logps, f_len, _ = self.sequence_logps(batch["forget"])
        m_logps, m_len, _ = self.sequence_logps(batch["mismatch"])
        retain = batch["retain"]
        r_logps, r_len, r_logits = self.sequence_logps(retain)
        kl = kl_divergence(
            r_logits, self.reference_logits(retain), retain["labels"], self.kl_positions, retain.get("attention_mask")
        )
        loss = ga_retain_loss(
            f_logps, f_len, m_logps, m_len, kl, self.forget_weight, self.random_weight, self.kl_weight
        )
        return loss, {
            "forget_nll": normalized_nll(f_logps, f_len).mean().detach(),
            "retain_nll": normalized_nll(r_logps, r_len).mean().detach(),
            "retain_kl": kl.detach(),
        }
