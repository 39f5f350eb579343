"""TOFU-GD: gradient difference (LENS Sec. 5; Liu et al. 2022).

L = γ·(−NLL̄(forget)) + α·NLL̄(retain), NLL̄ per sequence or per token of the batch (``token_average``).
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_unlearn.losses import TOKEN_AVERAGES, check_choice, gd_loss
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule, nonnegative_weights


class GradientDifference(UnlearningModule):
    """Gradient ascent on forget plus gradient descent on retain.

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        gamma: forget weight γ.
        alpha: retain weight α.
        token_average: ``sequence`` (default: NLL̄ = mean_i NLL_i/|y_i|) or ``batch`` (ΣNLL/Σ|y| per batch, as
            OpenUnlearning's GradDiff computes both terms).

    Raises:
        ValueError: a negative or non-finite ``gamma`` / ``alpha``, or an unknown ``token_average``.

    Example::

        >>> from lightning_unlearn.objectives import GradientDifference
        >>> # a negative retain weight would forget
        >>> GradientDifference("models/start", alpha=-1.0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_unlearn.errors.ConfigError: alpha=-1.0 must be a finite weight >= 0 ...
    """

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        collapse_fraction: float | None = None,
        gamma: float = 1.0,
        alpha: float = 1.0,
        token_average: str = "sequence",
    ) -> None:
        nonnegative_weights(gamma=gamma, alpha=alpha)
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        check_choice("token_average", token_average, TOKEN_AVERAGES)
        self.save_hyperparameters()
        self.gamma = gamma
        self.alpha = alpha
        self.token_average = token_average

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = γ·(−NLL̄(forget)) + α·NLL̄(retain) (per ``token_average``).

        Args:
            batch: ``{"forget": LM batch, "retain": LM batch}`` (``input_ids``, ``attention_mask``, ``labels``,
                each ``(B, T)``).

        Returns:
            ``(loss, {"forget_nll", "retain_nll"})``.
        """
        sums, logs = self.forget_retain_logps(batch)
        return gd_loss(*sums, self.gamma, self.alpha, self.token_average), logs
