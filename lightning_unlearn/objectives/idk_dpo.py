"""IdkDPO: TOFU's DPO baseline with an "I don't know" answer preferred over the forget answer.

The loss of :class:`~lightning_unlearn.objectives.DPO` (:func:`~lightning_unlearn.objectives.dpo.preference_loss`)
with y_w = the row's seeded idk answer (:mod:`lightning_unlearn.data.idk`) to its own prompt tokens; the datamodule
is the plain ``ForgetRetainDataModule``. β 0.1, γ 1, α 1 as OpenUnlearning's ``tofu/idk`` experiment (DPO trainer).
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_unlearn.data.collate import with_answers
from lightning_unlearn.data.idk import IdkAnswers
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import DPO_SCALES, TOKEN_AVERAGES, check_choice
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives.dpo import preference_loss
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule, nonnegative_weights


class IdkDPO(UnlearningModule):
    """DPO toward "I don't know" and away from the forget answer, against the start model.

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
        idk_answers: a shipped language (``en``, ``uk``, ``zh-Hans``, ``zh-Hant``) or a text file, one answer a line.
        idk_seed: seed of the per-row choice of idk answer.

    Raises:
        ValueError: a negative or non-finite ``gamma`` / ``alpha``, a ``beta`` that is not positive, an
            unknown ``scale`` / ``token_average``, or an idk file without answers.
        FileNotFoundError: ``idk_answers`` is neither a shipped language nor a file.

    Example::

        >>> from lightning_unlearn.objectives import IdkDPO
        >>> # checked before any model is read
        >>> IdkDPO("models/start", alpha=-1.0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_unlearn.errors.ConfigError: alpha=-1.0 must be a finite weight >= 0 ...
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
        idk_answers: str = "en",
        idk_seed: int = 0,
    ) -> None:
        nonnegative_weights(gamma=gamma, alpha=alpha)
        # checked before the base class loads the tokenizer: a bad value is refused at once
        if beta <= 0:
            raise ConfigError(f"IdkDPO beta must be positive, got {beta}.")
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        check_choice("scale", scale, DPO_SCALES)
        check_choice("token_average", token_average, TOKEN_AVERAGES)
        self.save_hyperparameters()
        self.beta, self.gamma, self.alpha, self.scale, self.token_average = beta, gamma, alpha, scale, token_average
        self.idk = IdkAnswers(idk_answers, idk_seed)

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """γ·DPO(an idk answer over the forget answer) + α·NLL̄(retain) (:func:`~.dpo.preference_loss`).

        Args:
            batch: ``{"forget", "retain"}`` LM batches; the forget batch's ``index`` seeds each row's idk
                answer.

        Returns:
            ``(loss, {"forget_nll", "preferred_nll", "dpo_loss", "retain_nll"})`` (``retain_nll`` when α > 0).
        """
        forget = batch["forget"]
        answers = self.idk.token_ids(self.tokenizer, forget["index"].tolist())
        preferred = with_answers(forget, answers, self.tokenizer.pad_token_id)
        return preference_loss(
            self, preferred, batch, self.beta, self.gamma, self.alpha, self.scale, self.token_average
        )
