"""SimNPO (Fan et al. 2025; Lacuna Sec. 4.1 and App. D), reference-free and length-normalised.

L = γ·L_f + α·NLL̄(retain), L_f = −(2/β)·mean log σ(−(β/|y|)·log π_θ(y|x) − δ).
Lacuna 1B (Table 5): γ 3, α 0.01, β 10, δ 1.5, lr 1e-4, constant schedule.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import nll_loss, normalized_nll, simnpo_loss
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule


class SimNPO(UnlearningModule):
    """SimNPO forget loss plus a retain NLL anchor.

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        gamma: forget weight γ.
        alpha: retain weight α.
        beta: temperature β.
        delta: reward margin δ (outside β).

    Raises:
        ValueError: a ``beta`` that is not positive.

    Example::

        >>> import torch
        >>> from lightning_unlearn.losses import simnpo_loss
        >>> # an answer the model is sure of (log π = 0) costs (2/β)·softplus(δ)
        >>> simnpo_loss(torch.tensor([0.0]), torch.tensor([3]), beta=10.0, delta=1.5)
        tensor(0.3403)
    """

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        collapse_fraction: float | None = None,
        gamma: float = 3.0,
        alpha: float = 0.01,
        beta: float = 10.0,
        delta: float = 1.5,
    ) -> None:
        # checked before the base class loads the tokenizer: a bad value is refused at once
        if beta <= 0:
            raise ConfigError(f"SimNPO beta must be positive, got {beta}.")
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        self.save_hyperparameters()
        self.gamma, self.alpha, self.beta, self.delta = gamma, alpha, beta, delta

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = γ·SimNPO(forget) + α·NLL̄(retain).

        Args:
            batch: ``{"forget": LM batch, "retain": LM batch}`` (``input_ids``, ``attention_mask``, ``labels``,
                each ``(B, T)``).

        Returns:
            ``(loss, {"forget_nll", "retain_nll", "simnpo_loss"})``.
        """
        f_logps, f_len, _ = self.sequence_logps(batch["forget"])
        r_logps, r_len, _ = self.sequence_logps(batch["retain"])
        forget_loss = simnpo_loss(f_logps, f_len, self.beta, self.delta)
        retain_nll = nll_loss(r_logps, r_len)
        return self.gamma * forget_loss + self.alpha * retain_nll, {
            "forget_nll": normalized_nll(f_logps, f_len).mean().detach(),
            "retain_nll": retain_nll.detach(),
            "simnpo_loss": forget_loss.detach(),
        }
