"""NPO: negative preference optimisation (Zhang et al. 2024; LENS Sec. 5).

L = −(2/β)·mean log σ(−β·(log π_θ(y|x) − log π_ref(y|x))) on forget pairs, β = 0.1; π_ref is the start model
(with LoRA: the same model with the adapter disabled). Optionally + α·NLL̄(retain) (``retain_weight``; 0 = pure NPO
as in LENS).
"""

from __future__ import annotations

import torch

from lightning_unlearn.losses import nll_loss, normalized_nll, npo_loss, sequence_logprobs
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule


class NPO(UnlearningModule):
    """Negative preference optimisation against the frozen start model.

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        beta: inverse temperature β.
        retain_weight: weight of an added retain NLL term (0 disables it and skips the retain forward).
    """

    needs_reference = True

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        beta: float = 0.1,
        retain_weight: float = 0.0,
    ) -> None:
        super().__init__(model_path, adapter, optim, max_bad_loss)
        self.save_hyperparameters()
        if beta <= 0:
            raise ValueError(f"NPO beta must be positive, got {beta}.")
        self.beta = beta
        self.retain_weight = retain_weight

    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        forget = batch["forget"]
        f_logps, f_len, _ = self.sequence_logps(forget)
        ref_logps, _ = sequence_logprobs(self.reference_logits(forget), forget["labels"])
        loss = npo_loss(f_logps, ref_logps, self.beta)
        logs = {"forget_nll": normalized_nll(f_logps, f_len).mean().detach(), "npo_loss": loss.detach()}
        if self.retain_weight:
            r_logps, r_len, _ = self.sequence_logps(batch["retain"])
            retain_nll = nll_loss(r_logps, r_len)
            loss = loss + self.retain_weight * retain_nll
            logs["retain_nll"] = retain_nll.detach()
        return loss, logs
