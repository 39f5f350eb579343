"""TOFU-GA: gradient ascent on the forget set (LENS Sec. 5).

L = −NLL̄(forget), the mean answer NLL with its sign flipped (``token_average``: per sequence, or per token of the
batch as OpenUnlearning computes it).
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_unlearn.losses import TOKEN_AVERAGES, check_choice, ga_loss, normalized_nll
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule


class GradientAscent(UnlearningModule):
    """Gradient ascent; the retain batch is not used.

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        token_average: ``sequence`` (default: each forget answer weighs the same, NLL̄ = mean_i NLL_i/|y_i|) or
            ``batch`` (each answer token weighs the same: ΣNLL/Σ|y|, OpenUnlearning's GA).

    Raises:
        ValueError: an unknown ``token_average``.

    Example::

        >>> import torch
        >>> from lightning_unlearn.losses import ga_loss
        >>> # GradientAscent's loss: −NLL̄ of two forget answers (NLL̄ 2.0 and 0.5)
        >>> ga_loss(torch.tensor([-6.0, -1.0]), torch.tensor([3, 2]))
        tensor(-1.2500)
    """

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        collapse_fraction: float | None = None,
        token_average: str = "sequence",
    ) -> None:
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        check_choice("token_average", token_average, TOKEN_AVERAGES)
        self.save_hyperparameters()
        self.token_average = token_average

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = −NLL̄(forget) (per ``token_average``); the retain batch is not read.

        Args:
            batch: ``{"forget": LM batch, "retain": LM batch}`` (``input_ids``, ``attention_mask``, ``labels``,
                each ``(B, T)``).

        Returns:
            ``(loss, {"forget_nll": mean NLL̄ of the forget batch})``.
        """
        logps, lengths, _ = self.sequence_logps(batch["forget"])
        loss = ga_loss(logps, lengths, self.token_average)
        return loss, {"forget_nll": normalized_nll(logps, lengths).mean().detach()}
