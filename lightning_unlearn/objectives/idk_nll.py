"""IdkNLL: TOFU's "I don't know" baseline (Maini et al. 2024).

L = γ·NLL̄(forget prompt, idk answer) + α·NLL̄(retain). The idk answer of each forget row is built here from the
row's own prompt tokens and a seeded choice from the shipped list (:mod:`lightning_unlearn.data.idk`), so the
datamodule is the plain ``ForgetRetainDataModule``.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_unlearn.data.collate import with_answers
from lightning_unlearn.data.idk import IdkAnswers
from lightning_unlearn.losses import TOKEN_AVERAGES, check_choice, idk_nll_loss, normalized_nll
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule, nonnegative_weights


class IdkNLL(UnlearningModule):
    """Gradient descent on an "I don't know" answer to each forget prompt, plus a retain NLL anchor.

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        gamma: weight γ of the idk NLL.
        alpha: weight α of the retain NLL (0 skips the retain forward).
        idk_answers: a shipped language (``en``, ``uk``, ``zh-Hans``, ``zh-Hant``) or a text file, one answer a line.
        idk_seed: seed of the per-row choice of idk answer.
        token_average: ``sequence`` (default) or ``batch`` (TOFU's / OpenUnlearning's HF mean), per term.

    Raises:
        ValueError: a negative or non-finite ``gamma`` / ``alpha``, an unknown ``token_average``, or an idk
            file without answers.
        FileNotFoundError: ``idk_answers`` is neither a shipped language nor a file.

    Example::

        >>> from lightning_unlearn.data.idk import IdkAnswers
        >>> # the answer IdkNLL trains forget row 0 toward (seeded: the same on every rank and resume)
        >>> IdkAnswers("en", seed=0).text(0)
        "I'm not able to say for sure."
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
        idk_answers: str = "en",
        idk_seed: int = 0,
        token_average: str = "sequence",
    ) -> None:
        nonnegative_weights(gamma=gamma, alpha=alpha)
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        check_choice("token_average", token_average, TOKEN_AVERAGES)
        self.save_hyperparameters()
        self.gamma, self.alpha, self.token_average = gamma, alpha, token_average
        self.idk = IdkAnswers(idk_answers, idk_seed)

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = γ·NLL̄(forget prompt, idk answer) + α·NLL̄(retain); the forget NLL̄ is watched without gradient.

        Args:
            batch: ``{"forget", "retain"}`` LM batches; the forget batch's ``index`` seeds each row's idk
                answer.

        Returns:
            ``(loss, {"forget_nll", "idk_nll", "retain_nll"})`` (``retain_nll`` when α > 0).
        """
        forget = batch["forget"]
        idk_batch = with_answers(
            forget, self.idk.token_ids(self.tokenizer, forget["index"].tolist()), self.tokenizer.pad_token_id
        )
        idk_logps, idk_len, _ = self.sequence_logps(idk_batch)
        with torch.no_grad():  # the forget NLL is watched (stop rule, logs), not trained on
            f_logps, f_len, _ = self.sequence_logps(forget)
        logs = {
            "forget_nll": normalized_nll(f_logps, f_len).mean(),
            "idk_nll": normalized_nll(idk_logps, idk_len).mean().detach(),
        }
        if self.alpha:
            r_logps, r_len, _ = self.sequence_logps(batch["retain"])
            logs["retain_nll"] = normalized_nll(r_logps, r_len).mean().detach()
        else:
            r_logps, r_len = idk_logps.new_zeros(1), idk_len.new_ones(1)
        return idk_nll_loss(idk_logps, idk_len, r_logps, r_len, self.gamma, self.alpha, self.token_average), logs
