"""QA instruction tuning with LoRA on the last two blocks (Lacuna Section 3.3).

Those blocks are outside θ_mask, so instruction tuning never touches the parameters that hold the injected PII.
The module validates on the held-out 30% (``trainer.val_check_interval`` = every N steps), keeps the adapter
weights with the lowest validation loss, and at the end of ``fit`` exports them merged into the base model:
``<root>/export/model`` (HF format, with tokenizer; written atomically). With ``validate_untrained`` the base
model itself (the adapter before its first step) is validated too and kept when no trained adapter beats it.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from lightning.pytorch import LightningModule
from typing_extensions import override

from lightning_unlearn.atomic import write_directory_atomically
from lightning_unlearn.checkpoints import RestoresRNG
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import nll_loss, sequence_logprobs
from lightning_unlearn.models import AdapterConfig, apply_adapter, eval_mode, load_causal_lm, load_tokenizer
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.strategies.masked_fsdp import load_model_for_rank


class InstructionModule(RestoresRNG, LightningModule):
    """Answer-only NLL fine-tuning through a peft adapter, keeping the best validation checkpoint.

    Args:
        model_path: local HF directory of the injected model θ_inj.
        adapter: which parameters train; Lacuna: LoRA on the last two blocks (``layers: [-2, -1]``).
        optim: AdamW and its schedule (:class:`OptimizerConfig`, as every objective takes it; default lr 1e-3,
            constant).
        export_dir: where to export; ``None`` = ``<trainer.default_root_dir>/export``.
        validate_untrained: validate once before the first step and count the untrained adapter (``best_step``
            0, the base model unchanged) as a candidate of the best-checkpoint selection.

    Example::

        >>> from lightning_unlearn.objectives import InstructionModule
        >>> module = InstructionModule("runs/lacuna/inj")  # the model loads in configure_model
        >>> module.adapter.kind, module.adapter.layers, module.optim_config.lr  # Lacuna's defaults
        ('lora', [-2, -1], 0.001)
    """

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        export_dir: str | None = None,
        validate_untrained: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(optim, dict):
            optim = OptimizerConfig(**optim)
        self.optim_config = optim or OptimizerConfig(lr=1e-3)
        self.save_hyperparameters()
        self.hparams["optim"] = asdict(self.optim_config)
        if isinstance(adapter, dict):
            adapter = AdapterConfig(**adapter)
        self.adapter = adapter or AdapterConfig(kind="lora", r=8, alpha=16, dropout=0.0, layers=[-2, -1])
        self.hparams["adapter"] = asdict(self.adapter)  # a plain dict keeps checkpoints weights_only-loadable
        self.model = None
        self.tokenizer = None
        self.best_val_loss = float("inf")
        self.best_step = -1
        self.val_losses: list[list] = []  # [global step, validation loss] of every validation, in order
        self._best_state: dict[str, torch.Tensor] | None = None

    @property
    def tokenizer_dir(self) -> str:
        """Where the tokenizer lives (read by the datamodule): ``model_path``."""
        return self.hparams.model_path

    @override
    def configure_model(self) -> None:
        """Load the tokenizer and the model with its adapter, once (under FSDP rank 0 reads the weights)."""
        if self.model is not None:
            return
        self.tokenizer = load_tokenizer(self.hparams.model_path)
        # from_pretrained returns eval mode and Lightning keeps module modes: train in train mode (LoRA dropout on).
        self.model = apply_adapter(load_model_for_rank(self.hparams.model_path, self._trainer), self.adapter).train()

    def _loss(self, batch: dict) -> torch.Tensor:
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return nll_loss(*sequence_logprobs(logits, batch["labels"]))

    @override
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """Answer-only NLL̄ of the batch, logged as ``train/loss``.

        Args:
            batch: an LM batch (``input_ids``, ``attention_mask``, ``labels``).
            batch_idx: the batch's index.

        Returns:
            The scalar loss.
        """
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    @override
    def validation_step(self, batch: dict, batch_idx: int) -> None:
        """Log the batch's answer-only NLL̄ as ``val/loss`` (synced across ranks).

        Args:
            batch: an LM batch.
            batch_idx: the batch's index.
        """
        self.log("val/loss", self._loss(batch), prog_bar=True, sync_dist=True, batch_size=batch["input_ids"].shape[0])

    @override
    def on_train_start(self) -> None:
        """With ``validate_untrained``, on a fresh run: validate the untrained adapter as the step-0 candidate.

        Raises:
            ValueError: no datamodule gives the validation data, or the validation set is empty.
        """
        super().on_train_start()
        # A resumed run restored its best (step ≥ 0) from the checkpoint; only a fresh run validates the start.
        if not self.hparams.validate_untrained or self.best_step >= 0:
            return
        if self.trainer.datamodule is None:
            raise ConfigError(
                "validate_untrained needs the validation data from a datamodule: trainer.fit(module, datamodule=...)."
            )
        loss = self._untrained_val_loss(self.trainer.datamodule.val_dataloader())
        self.val_losses.append([0, loss])
        if loss < self.best_val_loss:
            self.best_val_loss, self.best_step = loss, 0
            self._best_state = self._trainable_state()
        for logger in self.loggers:
            logger.log_metrics({"val/untrained_loss": loss}, step=0)

    @torch.no_grad()
    def _untrained_val_loss(self, loader) -> float:
        # The whole validation set on every rank (same batches, same order), so ranks agree without a collective
        # and sharded (FSDP) forwards stay in step. Weighted by batch size like the logged val/loss.
        total, count = 0.0, 0
        with eval_mode(self.model):
            for batch in loader:
                batch = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                size = batch["input_ids"].shape[0]
                total += float(self._loss(batch)) * size
                count += size
        self.model.train()  # as the training that follows expects (LoRA dropout on)
        if count == 0:
            raise ConfigError("validate_untrained: the validation set is empty; raise val_fraction.")
        return total / count

    def _trainable_state(self) -> dict[str, torch.Tensor]:
        """Full CPU copies of the trained (adapter) weights; collective under FSDP2 (every rank calls it at the same
        point: the synced validation loss makes the same decision on every rank)."""
        from torch.distributed.tensor import DTensor

        state = {}
        for n, p in self.model.named_parameters():
            if p.requires_grad:
                t = p.detach()
                state[n] = (t.full_tensor() if isinstance(t, DTensor) else t).clone().cpu()
        return state

    @override
    def on_validation_epoch_end(self) -> None:
        """Record the validation loss and keep the adapter weights when they are the best so far (collective)."""
        if self.trainer.sanity_checking:
            return
        val = self.trainer.callback_metrics.get("val/loss")
        if val is not None:
            self.val_losses.append([self.trainer.global_step, float(val)])
        if val is not None and float(val) < self.best_val_loss:
            self.best_val_loss, self.best_step = float(val), self.trainer.global_step
            self._best_state = self._trainable_state()
        self.log("val/best_loss", self.best_val_loss)

    @override
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Save the best adapter's loss, step, weights and the validation history with the checkpoint.

        Args:
            checkpoint: the checkpoint dict being saved (``best_adapter`` is added).
        """
        super().on_save_checkpoint(checkpoint)
        checkpoint["best_adapter"] = {"loss": self.best_val_loss, "step": self.best_step, "state": self._best_state,
                                      "val_losses": self.val_losses}  # fmt: skip

    @override
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore the best adapter and the validation history of a checkpoint.

        Args:
            checkpoint: the loaded checkpoint dict.
        """
        super().on_load_checkpoint(checkpoint)
        best = checkpoint.get("best_adapter")
        if best:
            self.best_val_loss, self.best_step, self._best_state = best["loss"], best["step"], best["state"]
            self.val_losses = best.get("val_losses", [])

    @override
    def configure_optimizers(self):
        """AdamW over the adapter's parameters with :attr:`optim_config`'s per-step schedule.

        Returns:
            Lightning's ``{"optimizer", "lr_scheduler"}`` dict.
        """
        params = [p for p in self.parameters() if p.requires_grad]
        return self.optim_config.configure(params, int(self.trainer.estimated_stepping_batches))

    def merged_best_model(self, state: dict[str, torch.Tensor] | None = None):
        """A plain transformers model: the base with the best adapter weights (or ``state``) merged in.

        Under FSDP2 the module's model is sharded, so the merge happens on a fresh CPU copy of the base model with
        the same adapter: only the adapter trained, so base + adapter state is the whole model (no collectives).
        """
        state = state if state is not None else self._best_state
        model = self.model
        from lightning_unlearn.distributed import is_sharded

        if is_sharded(self.model):
            model = apply_adapter(load_causal_lm(self.hparams.model_path), self.adapter)
            missing = set(state or {}) - {n for n, _ in model.named_parameters()}
            if state is None or missing:
                raise RuntimeError(f"cannot rebuild the tuned model on one process: adapter weights {missing} unknown.")
        if state is not None:
            params = dict(model.named_parameters())
            with torch.no_grad():
                for n, t in state.items():
                    params[n].copy_(t.to(params[n].device))
        merge = getattr(model, "merge_and_unload", None)
        return merge() if callable(merge) else model

    @override
    def on_fit_end(self) -> None:
        """Export the best (else the last) adapter merged into the base to ``<export_dir>/model`` with ``run.json``.

        Rank 0 writes, atomically; gathering the weights is collective under FSDP2. Skipped when interrupted.
        """
        if self.trainer.interrupted:
            return
        # No validation ran: export the last weights. Gathering them is collective under FSDP2, so every rank does it.
        state = self._best_state if self._best_state is not None else self._trainable_state()
        if self.trainer.global_rank != 0:
            return
        merged = self.merged_best_model(state)
        export = Path(self.hparams.export_dir or Path(self.trainer.default_root_dir) / "export")

        def write(tmp: Path) -> None:
            merged.save_pretrained(tmp / "model")
            self.tokenizer.save_pretrained(tmp / "model")
            info = {"best_val_loss": self.best_val_loss, "best_step": self.best_step, "val_losses": self.val_losses,
                    "model_path": self.tokenizer_dir}  # fmt: skip
            (tmp / "run.json").write_text(json.dumps(info, indent=1))

        write_directory_atomically(export, write)
