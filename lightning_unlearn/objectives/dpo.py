"""DPO on forget prompts (Rafailov et al. 2023): prefer the answer the data gives over the forget answer.

L = γ·L_DPO + α·NLL̄(retain), L_DPO = −c·mean log σ(β·[log π_θ/π_ref(y_w|x) − log π_θ/π_ref(y_l|x)]), y_w = the
row's preferred answer (``PreferenceDataModule``), y_l = its forget answer, π_ref = the start model (LoRA: adapter
disabled). β 0.1, γ 1, α 1 as OpenUnlearning's DPO config; c = 1 (the paper) or 2/β (OpenUnlearning), ``scale``.
:class:`~lightning_unlearn.objectives.IdkDPO` is the same loss with y_w an "I don't know" answer.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_unlearn.data.collate import with_answers
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import (
    DPO_SCALES,
    TOKEN_AVERAGES,
    check_choice,
    dpo_loss,
    normalized_nll,
    sequence_logprobs,
)
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule, nonnegative_weights


def preference_loss(
    module: UnlearningModule,
    preferred: dict,
    batch: dict,
    beta: float,
    gamma: float,
    alpha: float,
    scale: str,
    token_average: str,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """γ·DPO(preferred over ``batch["forget"]``) + α·NLL̄(``batch["retain"]``) and its logs; shared by DPO and
    IdkDPO (``preferred``: the forget prompts with the preferred answers, an LM batch)."""
    forget = batch["forget"]
    w_logps, w_len, _ = module.sequence_logps(preferred)
    l_logps, l_len, _ = module.sequence_logps(forget)
    ref_w, _ = sequence_logprobs(module.reference_logits(preferred), preferred["labels"])
    ref_l, _ = sequence_logprobs(module.reference_logits(forget), forget["labels"])
    forget_loss = dpo_loss(w_logps, l_logps, ref_w, ref_l, beta, scale)
    loss = gamma * forget_loss
    logs = {
        "forget_nll": normalized_nll(l_logps, l_len).mean().detach(),
        "preferred_nll": normalized_nll(w_logps, w_len).mean().detach(),
        "dpo_loss": forget_loss.detach(),
    }
    return loss + module.retain_term(batch, alpha, token_average, logs), logs


class DPO(UnlearningModule):
    """DPO with the preferred answer from the data (``PreferenceDataModule``'s ``preferred_ids``).

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        beta: inverse temperature β (OpenUnlearning 0.1).
        gamma: weight γ of the DPO term.
        alpha: weight α of the retain NLL (0 skips the retain forward).
        scale: ``one`` (the paper's DPO) or ``two_over_beta`` (OpenUnlearning's 2/β factor).
        token_average: retain NLL̄ per ``sequence`` (default) or per token of the ``batch`` (OpenUnlearning's).

    Raises:
        ValueError: a negative or non-finite ``gamma`` / ``alpha``, a ``beta`` that is not positive, or an
            unknown ``scale`` / ``token_average``.

    Example::

        >>> from lightning_unlearn.objectives import DPO
        >>> # checked before any model is read
        >>> DPO("models/start", gamma=-1.0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_unlearn.errors.ConfigError: gamma=-1.0 must be a finite weight >= 0 ...
    """

    needs_reference = True

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        collapse_fraction: float | None = None,
        beta: float = 0.1,
        gamma: float = 1.0,
        alpha: float = 1.0,
        scale: str = "one",
        token_average: str = "sequence",
    ) -> None:
        nonnegative_weights(gamma=gamma, alpha=alpha)
        # checked before the base class loads the tokenizer: a bad value is refused at once
        if beta <= 0:
            raise ConfigError(f"DPO beta must be positive, got {beta}.")
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        check_choice("scale", scale, DPO_SCALES)
        check_choice("token_average", token_average, TOKEN_AVERAGES)
        self.save_hyperparameters()
        self.beta, self.gamma, self.alpha, self.scale, self.token_average = beta, gamma, alpha, scale, token_average

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """γ·DPO(preferred answer over forget answer) + α·NLL̄(retain) (:func:`preference_loss`).

        Args:
            batch: ``{"forget", "retain"}`` LM batches; the forget batch carries ``preferred_ids``, the preferred
                answer's tokens per row.

        Returns:
            ``(loss, {"forget_nll", "preferred_nll", "dpo_loss", "retain_nll"})`` (``retain_nll`` when α > 0).

        Raises:
            RuntimeError: the forget batch has no ``preferred_ids`` (use ``PreferenceDataModule``).
        """
        forget = batch["forget"]
        if "preferred_ids" not in forget:
            raise RuntimeError(
                "DPO needs a preferred answer per forget row: use data.class_path "
                "lightning_unlearn.data.preference.PreferenceDataModule (or IdkDPO for 'I don't know' answers)."
            )
        preferred = with_answers(forget, forget["preferred_ids"], self.tokenizer.pad_token_id)
        return preference_loss(
            self, preferred, batch, self.beta, self.gamma, self.alpha, self.scale, self.token_average
        )
