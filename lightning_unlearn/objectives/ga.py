"""TOFU-GA: gradient ascent on the forget set (LENS Sec. 5).

L = −NLL̄(forget), the mean length-normalised answer NLL with its sign flipped.
"""

from __future__ import annotations

import torch

from lightning_unlearn.losses import ga_loss, normalized_nll
from lightning_unlearn.objectives.unlearning_module import UnlearningModule


class GradientAscent(UnlearningModule):
    """Gradient ascent; the retain batch is not used. Constructor arguments are those of ``UnlearningModule``."""

    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logps, lengths, _ = self.sequence_logps(batch["forget"])
        return ga_loss(logps, lengths), {"forget_nll": normalized_nll(logps, lengths).mean().detach()}
