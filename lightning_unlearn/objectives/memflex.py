"""MemFlex (Tian et al. 2024, "To Forget or Not?"; Lacuna Sec. 4.1, App. G.2).

1. Localise: with ḡ_f and ḡ_r the gradients of the mean NLL̄ over the whole forget and retain sets, select every
   trainable tensor with cos(ḡ_f, ḡ_r) < ``similarity_threshold`` (forget and retain knowledge diverge there) and
   mean|ḡ_f| > ``gradient_threshold`` (the forget set actually moves it). Done once, at the start of training.
2. Update only the selected tensors with L = forget_factor·NLL̄(forget) + retain_factor·NLL̄(retain)
   (Lacuna 1B: −0.6 / +2.0, lr 3e-4, thresholds 0.92 / 6e-4). Unselected tensors get no gradient, so AdamW
   leaves them bit-for-bit unchanged.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import move_data_to_device
from typing_extensions import override

from lightning_unlearn.distributed import local_view
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import nll_loss, weighted_nll_loss
from lightning_unlearn.models import AdapterConfig, eval_mode
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule


class MemFlex(UnlearningModule):
    """Gradient-similarity localisation of parameter tensors, then a weighted-NLL update confined to them.

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA (with an adapter, the adapter tensors are localised).
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        forget_factor: factor on the forget NLL̄ (negative: ascent).
        retain_factor: factor on the retain NLL̄.
        similarity_threshold: select tensors whose forget/retain gradient cosine is below this.
        gradient_threshold: ... and whose mean absolute forget gradient is above this.
        localization_batches: batches of each set used for ḡ_f, ḡ_r (``None``: all).

    Raises:
        ValueError: at the start of training, when localisation selects no tensor (:meth:`localize`).
        TypeError: at the start of training, without ``ForgetRetainDataModule`` (:meth:`localize`).

    Example::

        >>> import torch
        >>> from lightning_unlearn.losses import weighted_nll_loss
        >>> # MemFlex's update loss: −0.6 · NLL̄(forget) 2.0 + 2.0 · NLL̄(retain) 0.5
        >>> weighted_nll_loss(torch.tensor([-6.0]), torch.tensor([3]), torch.tensor([-1.0]), torch.tensor([2]))
        tensor(-0.2000)
    """

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        collapse_fraction: float | None = None,
        forget_factor: float = -0.6,
        retain_factor: float = 2.0,
        similarity_threshold: float = 0.92,
        gradient_threshold: float = 6e-4,
        localization_batches: int | None = None,
    ) -> None:
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        self.save_hyperparameters()
        self.forget_factor, self.retain_factor = forget_factor, retain_factor
        self.similarity_threshold, self.gradient_threshold = similarity_threshold, gradient_threshold
        self.localization_batches = localization_batches
        self.selected: list[str] | None = None

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = forget_factor·NLL̄(forget) + retain_factor·NLL̄(retain) (only selected tensors keep their gradient).

        Args:
            batch: ``{"forget": LM batch, "retain": LM batch}`` (``input_ids``, ``attention_mask``, ``labels``,
                each ``(B, T)``).

        Returns:
            ``(loss, {"forget_nll", "retain_nll"})``.
        """
        sums, logs = self.forget_retain_logps(batch)
        return weighted_nll_loss(*sums, self.forget_factor, self.retain_factor), logs

    @override
    def on_train_start(self) -> None:
        """Localise the tensors to update once (kept across resumes) and log how many were selected."""
        super().on_train_start()
        if self.selected is None:
            self.selected = self.localize()
        self.log("train/memflex_selected_tensors", float(len(self.selected)), rank_zero_only=True)

    @override
    def on_before_optimizer_step(self, optimizer) -> None:
        """Drop the gradient of every trainable tensor outside :attr:`selected`, so AdamW leaves it unchanged.

        Args:
            optimizer: the optimizer about to step.
        """
        super().on_before_optimizer_step(optimizer)
        keep = set(self.selected or ())
        for name, param in self.model.named_parameters():
            if param.requires_grad and name not in keep:
                param.grad = None

    def localize(self) -> list[str]:
        """Names (as in ``self.model.named_parameters()``) of the tensors MemFlex updates. Collective."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if not hasattr(datamodule, "forget_eval_dataloader"):
            raise TypeError("MemFlex localises with the whole forget/retain sets: use ForgetRetainDataModule.")
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        with eval_mode(self.model, grad=True):
            g_forget = self._mean_gradients(datamodule.forget_eval_dataloader(), named)
            g_retain = self._mean_gradients(datamodule.retain_eval_dataloader(), named)
        # Per tensor: [f·r, f·f, r·r, Σ|f|]; sums over local shards, all-reduced when sharded.
        stats = torch.stack(
            [
                torch.stack([(f * r).sum(), (f * f).sum(), (r * r).sum(), f.abs().sum()]).double()
                for f, r in zip(g_forget, g_retain)
            ]
        )
        if self._sharded and dist.is_initialized():
            dist.all_reduce(stats)
        cosine = stats[:, 0] / (stats[:, 1].sqrt() * stats[:, 2].sqrt()).clamp(min=1e-30)
        mean_abs = stats[:, 3] / torch.tensor([p.numel() for _, p in named], dtype=torch.float64, device=stats.device)
        chosen = [
            name
            for (name, _), c, m in zip(named, cosine.tolist(), mean_abs.tolist())
            if c < self.similarity_threshold and m > self.gradient_threshold
        ]
        chosen = self.trainer.strategy.broadcast(chosen)  # identical on every rank, whatever the float noise
        if not chosen:
            raise ConfigError(
                f"MemFlex selected no parameter tensor (similarity_threshold={self.similarity_threshold}, "
                f"gradient_threshold={self.gradient_threshold}; largest mean|g_forget| "
                f"{float(mean_abs.max()):.3g}); lower gradient_threshold or raise similarity_threshold."
            )
        return chosen

    def _mean_gradients(self, loader, named) -> list[torch.Tensor]:
        """Gradient of the mean NLL̄ over ``loader`` for each tensor of ``named`` (local shard under FSDP)."""
        params = [p for _, p in named]
        totals = [torch.zeros_like(local_view(p)) for p in params]
        n_batches = 0
        for i, batch in enumerate(loader):
            if self.localization_batches is not None and i >= self.localization_batches:
                break
            batch = move_data_to_device(batch, self.device)
            logps, lengths, _ = self.sequence_logps(batch)
            loss = nll_loss(logps, lengths)
            if self._sharded:
                # FSDP2 reduce-scatters in backward; every rank runs the same batches, so the mean is unchanged.
                loss.backward()
                grads = [p.grad for p in params]
            else:
                # autograd.grad does not fire DDP's gradient hooks (no all-reduce outside the training step).
                grads = torch.autograd.grad(loss, params, allow_unused=True)
            for total, g in zip(totals, grads):
                if g is not None:
                    total += local_view(g).detach()
            if self._sharded:
                for p in params:
                    p.grad = None
            n_batches += 1
        return [t / max(n_batches, 1) for t in totals]

    @override
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Save the selected tensor names with the checkpoint, so a resumed run updates the same tensors.

        Args:
            checkpoint: the checkpoint dict being saved (``memflex_selected`` is added).
        """
        super().on_save_checkpoint(checkpoint)
        checkpoint["memflex_selected"] = list(self.selected or [])

    @override
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore the selected tensor names of a checkpoint (none saved: localise again at the start).

        Args:
            checkpoint: the loaded checkpoint dict.
        """
        super().on_load_checkpoint(checkpoint)
        self.selected = checkpoint.get("memflex_selected") or None
