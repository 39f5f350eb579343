"""NPO: negative preference optimisation (Zhang et al. 2024; LENS Sec. 5).

L = −(2/β)·mean log σ(−β·(log π_θ(y|x) − log π_ref(y|x))) on forget pairs, β = 0.1; π_ref is the start model
(with LoRA: the same model with the adapter disabled). Optionally + α·NLL̄(retain) (``retain_weight``; 0 = pure NPO
as in LENS).

``reference="precomputed"`` computes log π_ref(y|x) of every forget pair once, before the first update, and looks
it up by the batch's ``index``: no frozen copy of the model (full fine-tuning) and no reference forward per step.
The values travel in checkpoints, so a resumed run keeps the start model's log-probs.
"""

from __future__ import annotations

import torch
from lightning.pytorch.utilities import move_data_to_device
from typing_extensions import override

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import nll_loss, normalized_nll, npo_loss, sequence_logprobs
from lightning_unlearn.models import AdapterConfig, eval_mode
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule, nonnegative_weights


class NPO(UnlearningModule):
    """Negative preference optimisation against the frozen start model.

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        beta: inverse temperature β.
        retain_weight: weight of an added retain NLL term (0 disables it and skips the retain forward).
        reference: ``"model"`` (reference forward every step) or ``"precomputed"`` (forget-set log-probs of the
            start model, computed once at the start of training; needs ``ForgetRetainDataModule``).

    Raises:
        ValueError: an unknown ``reference``, a negative ``retain_weight`` or a ``beta`` that is not positive.

    Example::

        >>> import torch
        >>> from lightning_unlearn.losses import npo_loss
        >>> from lightning_unlearn.objectives import NPO
        >>> NPO("models/start", reference="cached")  # checked before any model is read
        Traceback (most recent call last):
        ...
        lightning_unlearn.errors.ConfigError: NPO reference='cached' is not one of 'model', 'precomputed'.
        >>> logps = torch.tensor([-5.0, -2.0])
        >>> npo_loss(logps, logps, beta=0.1)  # at the start model, L = (2/β)·log 2
        tensor(13.8629)
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
        retain_weight: float = 0.0,
        reference: str = "model",
    ) -> None:
        if reference not in ("model", "precomputed"):
            raise ConfigError(f"NPO reference={reference!r} is not one of 'model', 'precomputed'.")
        # Read by UnlearningModule.__init__ before the model exists: precomputed log-probs need no frozen copy.
        self.needs_reference = reference == "model"
        nonnegative_weights(retain_weight=retain_weight)
        # checked before the base class loads the tokenizer: a bad value is refused at once
        if beta <= 0:
            raise ConfigError(f"NPO beta must be positive, got {beta}.")
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        self.save_hyperparameters()
        self.beta = beta
        self.retain_weight = retain_weight
        self.reference = reference
        self.reference_logps: torch.Tensor | None = None  # (N_forget,) when precomputed

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = NPO(forget against π_ref) + retain_weight·NLL̄(retain).

        Args:
            batch: ``{"forget", "retain"}`` LM batches; with ``reference='precomputed'`` the forget batch carries
                ``index``, each row's position in the forget set.

        Returns:
            ``(loss, {"forget_nll", "npo_loss", "retain_nll"})`` (``retain_nll`` when ``retain_weight`` > 0).

        Raises:
            RuntimeError: ``reference='precomputed'`` without precomputed log-probs or without the batch's ``index``.
        """
        forget = batch["forget"]
        f_logps, f_len, _ = self.sequence_logps(forget)
        if self.reference == "precomputed":
            if self.reference_logps is None or "index" not in forget:
                raise RuntimeError("NPO(reference='precomputed') needs ForgetRetainDataModule batches (with 'index').")
            ref_logps = self.reference_logps.to(f_logps.device)[forget["index"]]
        else:
            ref_logps, _ = sequence_logprobs(self.reference_logits(forget), forget["labels"])
        loss = npo_loss(f_logps, ref_logps, self.beta)
        logs = {"forget_nll": normalized_nll(f_logps, f_len).mean().detach(), "npo_loss": loss.detach()}
        if self.retain_weight:
            r_logps, r_len, _ = self.sequence_logps(batch["retain"])
            retain_nll = nll_loss(r_logps, r_len)
            loss = loss + self.retain_weight * retain_nll
            logs["retain_nll"] = retain_nll.detach()
        return loss, logs

    @override
    def on_train_start(self) -> None:
        """With ``reference='precomputed'``: compute the start model's log π_ref(y|x) of every forget pair once.

        Raises:
            TypeError: the datamodule is no ``ForgetRetainDataModule`` (from ``_start_model_logps``).
        """
        super().on_train_start()
        if self.reference == "precomputed" and self.reference_logps is None:
            self.reference_logps = self._start_model_logps()

    @torch.no_grad()
    def _start_model_logps(self) -> torch.Tensor:
        """log π(y|x) of every forget pair under the current (start) model, by row index. Collective under FSDP:
        every rank runs the same batches."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if not hasattr(datamodule, "forget_eval_dataloader"):
            raise TypeError("NPO(reference='precomputed') reads the forget set from ForgetRetainDataModule.")
        values = torch.zeros(len(datamodule.forget_eval_dataloader().dataset), dtype=torch.float32)
        with eval_mode(self.model):
            for batch in datamodule.forget_eval_dataloader():
                batch = move_data_to_device(batch, self.device)
                logps, _, _ = self.sequence_logps(batch)
                values[batch["index"].cpu()] = logps.float().cpu()
        return values

    @override
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Save the precomputed reference log-probs (when there are any) with the checkpoint.

        Args:
            checkpoint: the checkpoint dict being saved (``npo_reference_logps`` is added).
        """
        super().on_save_checkpoint(checkpoint)
        if self.reference_logps is not None:
            checkpoint["npo_reference_logps"] = self.reference_logps

    @override
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore the precomputed reference log-probs, so a resumed run keeps the start model's.

        Args:
            checkpoint: the loaded checkpoint dict.
        """
        super().on_load_checkpoint(checkpoint)
        self.reference_logps = checkpoint.get("npo_reference_logps")
