"""WGA: weighted gradient ascent (Wang et al. 2025, "Rethinking LLM Unlearning Objectives").

L = γ·(−mean_t p_t^β·NLL_t)(forget) + α·NLL̄(retain), p_t the (detached) probability of forget token t.
OpenUnlearning's WGA config: β 1, γ 1, α 1, lr 1e-5.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_unlearn.losses import (
    TOKEN_AVERAGES,
    answer_token_logprobs,
    check_choice,
    normalized_nll,
    wga_loss,
)
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule


class WGA(UnlearningModule):
    """Gradient ascent with each forget token weighted by its probability to the power β, plus a retain NLL.

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        beta: the weight's power β (0: plain GA).
        gamma: weight γ of the forget term.
        alpha: weight α of the retain NLL (0 skips the retain forward).
        token_average: ``sequence`` (default) or ``batch`` (OpenUnlearning's mean over the batch's tokens), for
            both terms.

    Raises:
        ValueError: an unknown ``token_average``.

    Example::

        >>> import torch
        >>> from lightning_unlearn.losses import wga_loss
        >>> # forget tokens at p 0.5 (weight 0.5, NLL ln 2) and 1.0 (NLL 0): −(0.5·ln 2 + 0) / 2
        >>> wga_loss(torch.tensor([[0.5, 1.0]]).log(), torch.tensor([[True, True]]), beta=1.0)
        tensor(-0.1733)
    """

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        collapse_fraction: float | None = None,
        beta: float = 1.0,
        gamma: float = 1.0,
        alpha: float = 1.0,
        token_average: str = "sequence",
    ) -> None:
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        check_choice("token_average", token_average, TOKEN_AVERAGES)
        self.save_hyperparameters()
        self.beta, self.gamma, self.alpha, self.token_average = beta, gamma, alpha, token_average

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = γ·(−mean_t p_t^β·NLL_t)(forget) + α·NLL̄(retain).

        Args:
            batch: ``{"forget": LM batch, "retain": LM batch}`` (``input_ids``, ``attention_mask``, ``labels``,
                each ``(B, T)``).

        Returns:
            ``(loss, {"forget_nll", "wga_loss", "retain_nll"})`` (``retain_nll`` when α > 0).
        """
        forget = batch["forget"]
        logits = self.model(input_ids=forget["input_ids"], attention_mask=forget["attention_mask"]).logits
        token_logps, answer_mask = answer_token_logprobs(logits, forget["labels"])
        forget_loss = wga_loss(token_logps, answer_mask, self.beta, self.token_average)
        f_logps, f_len = token_logps.sum(-1), answer_mask.sum(-1)
        loss = self.gamma * forget_loss
        logs = {"forget_nll": normalized_nll(f_logps, f_len).mean().detach(), "wga_loss": forget_loss.detach()}
        return loss + self.retain_term(batch, self.alpha, self.token_average, logs), logs
