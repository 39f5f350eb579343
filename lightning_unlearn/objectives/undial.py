"""UNDIAL (Dong et al. 2024): self-distillation toward the start model with the forget token's logit lowered.

L = γ_f·mean_t H(softmax(z_ref,t − s·e_{y_t}), p_θ,t) + α·NLL̄(retain) over forget answer tokens t, z_ref = the
start model's logits (LoRA: adapter disabled). OpenUnlearning's UNDIAL config: strength s (its ``beta``) 10, forget
weight 1, retain weight 0 (no retain term), lr 1e-4.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import TOKEN_AVERAGES, check_choice, normalized_nll, undial_loss
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule


class UNDIAL(UnlearningModule):
    """Distil the start model's adjusted next-token distribution on forget answers.

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        strength: how far the forget token's teacher logit is lowered (the paper's γ, OpenUnlearning's ``beta``).
        gamma: weight of the distillation term.
        alpha: weight of a retain NLL term (0, OpenUnlearning's default, skips the retain forward).
        token_average: ``sequence`` (default: each forget answer weighs the same) or ``batch`` (each answer token
            weighs the same, OpenUnlearning's mean; OpenUnlearning also counts prompt and padding positions).

    Raises:
        ValueError: a negative ``strength`` or an unknown ``token_average``.

    Example::

        >>> import torch
        >>> from lightning_unlearn.losses import undial_loss
        >>> logits, labels = torch.zeros(1, 2, 3), torch.tensor([[-100, 2]])  # one answer token, 3 words
        >>> undial_loss(logits, logits, labels, strength=0.0)  # strength 0: H(uniform) = ln 3
        tensor(1.0986)
    """

    needs_reference = True

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        collapse_fraction: float | None = None,
        strength: float = 10.0,
        gamma: float = 1.0,
        alpha: float = 0.0,
        token_average: str = "sequence",
    ) -> None:
        # checked before the base class loads the tokenizer: a bad value is refused at once
        if strength < 0:
            raise ConfigError(f"UNDIAL strength must be non-negative, got {strength}.")
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        check_choice("token_average", token_average, TOKEN_AVERAGES)
        self.save_hyperparameters()
        self.strength, self.gamma, self.alpha, self.token_average = strength, gamma, alpha, token_average

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = γ·H(start model's logits with the forget token lowered by ``strength``, p_θ) + α·NLL̄(retain).

        Args:
            batch: ``{"forget": LM batch, "retain": LM batch}`` (``input_ids``, ``attention_mask``, ``labels``,
                each ``(B, T)``).

        Returns:
            ``(loss, {"forget_nll", "undial_loss", "retain_nll"})`` (``retain_nll`` when α > 0).
        """
        forget = batch["forget"]
        f_logps, f_len, logits = self.sequence_logps(forget)
        teacher_logits = self.reference_logits(forget)
        distill = undial_loss(logits, teacher_logits, forget["labels"], self.strength, self.token_average)
        loss = self.gamma * distill
        logs = {"forget_nll": normalized_nll(f_logps, f_len).mean().detach(), "undial_loss": distill.detach()}
        return loss + self.retain_term(batch, self.alpha, self.token_average, logs), logs
