"""Base LightningModule of every unlearning objective: model, reference, optimizer, stop rule, adapter checkpoints.

A subclass only states its loss in :meth:`UnlearningModule.unlearning_loss`. Batches are
``{"forget": LM batch, "retain": LM batch}`` (see :mod:`lightning_unlearn.data.unlearning`).

Reference model (``needs_reference = True``): with a LoRA/AdaLoRA adapter it is the same network with the adapter
disabled (peft ``disable_adapter()``), so it costs no memory; with full fine-tuning it is a frozen copy of the start
model, sharded like the policy under FSDP and left out of checkpoints (it is ``model_path`` again). NPO can
precompute the reference log-probs instead (``NPO(reference="precomputed")``).

Checkpoints with an adapter hold only the trainable tensors (and buffers) in ``state_dict``: the frozen base is
``model_path`` again. FSDP sharded checkpoints (each rank writes its own shard) do the same under
:class:`~lightning_unlearn.strategies.MaskedFSDPStrategy`, which loads them back; under Lightning's
``ModelParallelStrategy``, whose loader requests every key, they keep the base too.
:meth:`UnlearningModule.load_state_dict` accepts them and refuses any other missing or unexpected key.

Distributed: under DDP nothing is special. Under FSDP2 (Lightning ``ModelParallelStrategy``) ``configure_model``
applies ``fully_shard`` to every transformer block and then to the whole network, for the policy and the reference.
Under :class:`~lightning_unlearn.strategies.MaskedFSDPStrategy` only rank 0 reads the weights: ``configure_model``
builds meta-device skeletons on the other ranks, and the strategy shards them and broadcasts rank 0's weights.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import warnings
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule
from torch import nn
from typing_extensions import override

from lightning_unlearn.atomic import write_directory_atomically
from lightning_unlearn.callbacks.stop_rule import StopRule
from lightning_unlearn.checkpoints import RestoresRNG
from lightning_unlearn.distributed import full_state_dict
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import nll_loss, normalized_nll, sequence_logprobs
from lightning_unlearn.models import AdapterConfig, apply_adapter, check_adapter_path, load_causal_lm, load_tokenizer
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.strategies.masked_fsdp import MaskedFSDPStrategy, load_model_for_rank

BLOCK_CONTAINERS = ("layers", "h", "blocks", "block")


def shard_transformer(model: nn.Module, mesh) -> None:
    """FSDP2: ``fully_shard`` each transformer block, then the root (embeddings, norm, head)."""
    from torch.distributed.fsdp import fully_shard

    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in BLOCK_CONTAINERS:
            for block in module:
                fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def nonnegative_weights(**weights: float) -> None:
    """Refuse a loss-term weight that is negative or not finite (one line naming it): a negative weight turns its
    term's descent into ascent (a retain term that forgets) without a word.

    Raises:
        ValueError: a weight below 0, NaN or infinite.
    """
    for name, value in weights.items():
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ConfigError(
                f"{name}={value} must be a finite weight >= 0 (a negative one turns its term's descent into ascent); "
                f"e.g. {name}: 1.0, or 0 to turn the term off."
            )


class UnlearningModule(RestoresRNG, LightningModule):
    """Shared machinery of unlearning objectives.

    Args:
        model_path: local directory of the model to unlearn (``save_pretrained`` layout, tokenizer included).
        adapter: what is trained: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and learning-rate schedule.
        max_bad_loss: stop the run when the mean forget NLL (length-normalised, nats per token) exceeds this
            (Yao et al.'s ``max_bad_loss``); ``None`` disables the bound. A non-finite loss always stops the run.
        collapse_fraction: stop the run when the mean retain NLL̄ of a batch reaches this fraction of ln |V|, the
            NLL̄ of a uniform output (0.9: the model has collapsed, even with a finite loss); ``None`` disables it.
            Objectives without a retain term compute the retain NLL̄ without gradient for it.

    The two bounds configure :attr:`stop_rule`, a :class:`~lightning_unlearn.callbacks.StopRule` that
    :meth:`configure_callbacks` attaches to every ``fit``. When a rule fires, the weights of that step were made by a
    bad update: the update is skipped, the run ends, and every checkpoint, adapter directory and evaluation row of
    that step is discarded (``last`` = the newest good checkpoint; ``CheckpointSelection`` records the stop).

    Raises:
        ValueError: a stop bound out of range (:class:`~lightning_unlearn.callbacks.StopRule`).
        FileNotFoundError: ``model_path`` or the adapter's ``path`` does not exist.

    Example::

        >>> import torch
        >>> from lightning_unlearn.losses import normalized_nll
        >>> # the NLL̄ that `forget_nll` logs and `max_bad_loss` bounds: −log π(y|x) / |y| per answer
        >>> normalized_nll(torch.tensor([-6.0, -1.0]), torch.tensor([3, 2]))
        tensor([2.0000, 0.5000])
    """

    # Subclasses that compare against the start model set this (NPO, GA-Retain).
    needs_reference: bool = False

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        collapse_fraction: float | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        # Checkpoints store both configs as plain dicts (loadable with weights_only=True); accept them back.
        self.adapter_config = AdapterConfig(**adapter) if isinstance(adapter, dict) else adapter or AdapterConfig()
        self.optim_config = OptimizerConfig(**optim) if isinstance(optim, dict) else optim or OptimizerConfig()
        self.stop_rule = StopRule(max_bad_loss, collapse_fraction)
        self.model_path = model_path
        self.tokenizer = load_tokenizer(model_path)
        if self.adapter_config.path is not None:
            check_adapter_path(self.adapter_config)  # now, not when configure_model loads the model
        self.reference_model: nn.Module | None = None
        if self.needs_reference and self.adapter_config.kind == "full":
            # The reference is model_path again: keep it out of checkpoints and do not require it when loading.
            self.strict_loading = False
        if self.adapter_config.kind != "full":
            # Adapter checkpoints hold only what training changes (the base is model_path again); load_state_dict
            # still refuses a checkpoint that lacks a trainable tensor. Lightning's FSDP full-file loader needs
            # non-strict loading to skip the absent frozen weights.
            self.strict_loading = False
        self._skip_update = False
        self._sharded = False

    @property
    def stop_reason(self) -> str | None:
        """Why the stop rule ended the last ``fit``; ``None`` when it did not."""
        return self.stop_rule.reason

    @property
    def stopped_at_step(self) -> int | None:
        """The step whose weights tripped the stop rule in the last ``fit`` (nothing of it or later was kept)."""
        return self.stop_rule.stopped_at_step

    @override
    def configure_callbacks(self) -> list[Callback]:
        """The callbacks every ``fit`` of this module gets: its :attr:`stop_rule`."""
        return [self.stop_rule]

    # -- model ------------------------------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The network being unlearned (peft-wrapped with an adapter).

        A Trainer builds it in :meth:`configure_model`, where under ``MaskedFSDPStrategy`` only rank 0 reads the
        weights; outside a Trainer the first access loads it.
        """
        if "model" not in self._modules:
            self._build_model(load_causal_lm(self.model_path))
        return self._modules["model"]

    def _build_model(self, base: nn.Module) -> None:
        if self.needs_reference and self.adapter_config.kind == "full":
            self.reference_model = copy.deepcopy(base).eval().requires_grad_(False)
        # from_pretrained returns eval mode and Lightning keeps module modes: train the policy in train mode
        # (LoRA dropout on); the frozen reference stays in eval mode.
        self.model = apply_adapter(base, self.adapter_config).train()
        self.on_model_built()

    def on_model_built(self) -> None:
        """Hook for subclasses: ``self.model`` (and the reference) now exist. On ranks > 0 under
        ``MaskedFSDPStrategy`` they are meta-device skeletons here, filled from rank 0 after sharding, so read
        names and shapes only."""

    @override
    def configure_model(self) -> None:
        """Build the policy (and reference) once, then shard it under FSDP2.

        Under ``MaskedFSDPStrategy`` only rank 0 reads the weights and the strategy shards after this hook; under
        ``ModelParallelStrategy`` each transformer block, then the root, is ``fully_shard``-ed here.
        """
        if "model" not in self._modules:
            self._build_model(load_model_for_rank(self.model_path, self._trainer))
        if self._sharded or self.device_mesh is None:
            return
        self._sharded = True
        if isinstance(self.trainer.strategy, MaskedFSDPStrategy):
            return  # it shards every block and child after this hook, then broadcasts rank 0's weights
        mesh = self.device_mesh["data_parallel"]
        shard_transformer(self.model, mesh)
        if self.reference_model is not None:
            shard_transformer(self.reference_model, mesh)

    def sequence_logps(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Policy forward: ``(summed answer log-probs (B,), answer lengths (B,), logits (B, T, V))``."""
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logps, lengths = sequence_logprobs(logits, batch["labels"])
        return logps, lengths, logits

    def forget_retain_logps(self, batch: dict) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        """Policy forwards of the forget and retain batches: ``((f_logps, f_len, r_logps, r_len), logs)`` with
        ``logs`` = the mean NLL̄ of each (``forget_nll``, ``retain_nll``)."""
        f_logps, f_len, _ = self.sequence_logps(batch["forget"])
        r_logps, r_len, _ = self.sequence_logps(batch["retain"])
        logs = {
            "forget_nll": normalized_nll(f_logps, f_len).mean().detach(),
            "retain_nll": normalized_nll(r_logps, r_len).mean().detach(),
        }
        return (f_logps, f_len, r_logps, r_len), logs

    @torch.no_grad()
    def reference_logits(self, batch: dict) -> torch.Tensor:
        """Logits of the start model on ``batch`` (``(B, T, V)``, no gradient)."""
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        policy = self.model  # builds the reference with it outside a Trainer
        if self.reference_model is not None:
            return self.reference_model(**inputs).logits
        if self.adapter_config.kind == "full":
            raise RuntimeError(f"{type(self).__name__} has no reference model; set needs_reference = True.")
        with policy.disable_adapter():
            return policy(**inputs).logits

    # -- loss -------------------------------------------------------------------------------------------------
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The objective: ``(loss, logs)``; ``logs["forget_nll"]`` (mean NLL̄ of the forget batch) is required."""
        raise NotImplementedError

    @override
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """The objective's loss, or an exact zero when the stop rule fires on this step (collective).

        Logs ``train/loss`` and every entry of the objective's logs as ``train/<key>``.

        Args:
            batch: ``{"forget": LM batch, "retain": LM batch}``.
            batch_idx: the batch's index.

        Returns:
            The scalar loss; after a stop, ``0 · loss`` with NaN/inf replaced, so every rank back-propagates zero.
        """
        loss, logs = self.unlearning_loss(batch)
        retain_nll = self._retain_nll(batch, logs) if self.stop_rule.needs_retain_nll else None
        # A collective: the stop rule decides on every rank alike, before the backward.
        stop = self.stop_rule.check(
            self.trainer, float(loss.detach()), float(logs["forget_nll"]), retain_nll, self.model.config.vocab_size
        )
        if stop:
            # Distributed Lightning cannot skip a step (returning None): back-propagate an exact zero instead, and
            # optimizer_step skips the update.
            self._skip_update = True
            return torch.nan_to_num(loss, nan=0.0, posinf=0.0, neginf=0.0) * 0.0
        self.log("train/loss", loss.detach(), prog_bar=True)
        self.log_dict({f"train/{k}": v.detach().float() for k, v in logs.items()})
        return loss

    def retain_term(self, batch: dict, alpha: float, token_average: str, logs: dict[str, torch.Tensor]):
        """``alpha · NLL(batch["retain"])`` (averaged per ``token_average``), with the retain NLL̄ added to ``logs``;
        ``0.0`` and no forward when ``alpha`` is 0. The retain term of every "forget term + α·retain NLL" objective."""
        if not alpha:
            return 0.0
        r_logps, r_len, _ = self.sequence_logps(batch["retain"])
        logs["retain_nll"] = normalized_nll(r_logps, r_len).mean().detach()
        return alpha * nll_loss(r_logps, r_len, token_average)

    def _retain_nll(self, batch: dict, logs: dict[str, torch.Tensor]) -> float:
        if "retain_nll" in logs:
            return float(logs["retain_nll"])
        with torch.no_grad():
            logps, lengths, _ = self.sequence_logps(batch["retain"])
        return float(normalized_nll(logps, lengths).mean())

    @override
    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Log the mean answer NLL̄ of a validation batch as ``val/forget_nll``, ``val/retain_nll`` or ``val/set<i>``.

        Args:
            batch: an LM batch (``input_ids``, ``attention_mask``, ``labels``).
            batch_idx: the batch's index.
            dataloader_idx: 0 = forget, 1 = retain, further loaders ``set<i>``.
        """
        logps, lengths, _ = self.sequence_logps(batch)
        name = ("forget", "retain")[dataloader_idx] if dataloader_idx < 2 else f"set{dataloader_idx}"
        self.log(
            f"val/{name}_nll",
            nll_loss(logps, lengths),
            add_dataloader_idx=False,
            sync_dist=True,
            batch_size=len(logps),
        )

    @override
    def on_train_start(self) -> None:
        """Restore a resumed run's RNG states and start updating again (a new ``fit`` after a stop)."""
        super().on_train_start()
        self._skip_update = False  # a new fit after a stop starts updating again

    # -- optimisation -----------------------------------------------------------------------------------------
    @override
    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        """Run the closure, then step unless the stop rule fired; with AdaLoRA, update its rank budget.

        Args:
            epoch: the current epoch.
            batch_idx: the batch's index.
            optimizer: the (Lightning-wrapped) optimizer.
            optimizer_closure: runs ``training_step`` and the backward.
        """
        # The closure (training_step, backward) runs first: the stop rule decides inside it whether to step. A
        # skipped step leaves the weights, the optimizer state and global_step as they are; every rank has run
        # the same (zero) backward, so DDP/FSDP stay in lockstep.
        result = optimizer_closure()
        if self._skip_update:
            # Lightning counts this call as a step all the same (global_step + 1 after this hook); the stop rule's
            # StopAwareCheckpoint saves nothing more of these weights.
            return
        super().optimizer_step(epoch, batch_idx, optimizer, lambda: result)
        # AdaLoRA's rank budget: peft asks for this call after every optimizer step, while the gradients exist
        # (Lightning zeroes them at the start of the next step). Not in on_train_batch_end: ModelCheckpoint saves
        # in its own on_train_batch_end, which runs before the module's, so the checkpoint would hold the weights
        # before this step's rank masking and a resumed run would skip it.
        if self.adapter_config.kind == "adalora" and not self._skip_update:
            self.model.base_model.update_and_allocate(self.global_step + 1)  # global_step counts it only after

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The model's parameters that train (``requires_grad``): the adapter, or every unfrozen weight."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @override
    def configure_optimizers(self):
        """AdamW over :meth:`trainable_parameters` with :attr:`optim_config`'s per-step schedule.

        Returns:
            Lightning's ``{"optimizer", "lr_scheduler"}`` dict (:meth:`OptimizerConfig.configure`).
        """
        total = int(self.trainer.estimated_stepping_batches) if self._trainer is not None else 1
        return self.optim_config.configure(self.trainable_parameters(), total)

    # -- checkpoints ------------------------------------------------------------------------------------------
    @override
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Make the checkpoint hold only what ``model_path`` cannot give back, and write the adapter directory.

        Dataclass hyperparameters become dicts; the reference model's keys go, and with an adapter the frozen base
        weights (unless sharded under a strategy that cannot load them back partially); an ``adapter-step=N``
        directory is written beside it; AdaLoRA's allocator state, the start model's weight fingerprint and every
        rank's RNG states are added.

        Args:
            checkpoint: the checkpoint dict being saved, changed in place.
        """
        hparams = checkpoint.get("hyper_parameters")
        if hparams is not None:
            checkpoint["hyper_parameters"] = {
                k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in hparams.items()
            }
        state = checkpoint.get("state_dict", {})
        for key in [k for k in state if k.startswith("reference_model.")]:
            del state[key]
        # Sharded (FSDP distributed) checkpoints keep every key unless the strategy can load them back without the
        # frozen ones (MaskedFSDPStrategy): Lightning's own sharded loader requests the module's whole state.
        sharded = any(hasattr(v, "to_local") for v in state.values())
        trainer = self._trainer  # None when a checkpoint is saved outside a Trainer
        strategy = trainer.strategy if trainer is not None else None
        partial_ok = getattr(strategy, "loads_partial_sharded_checkpoints", False)
        if self.adapter_config.kind != "full" and (not sharded or partial_ok):
            for key in self.frozen_weight_keys() & state.keys():
                del state[key]
        if self.adapter_config.kind != "full" and trainer is not None:
            self.save_adapter(self.adapter_dir())
        if self.adapter_config.kind == "adalora":
            checkpoint["adalora"] = self._adalora_state()
        # The starting model's identity by content, not path: a resume from a moved copy of the same weights is the
        # same model (the CLI compares it when model_path differs).
        if getattr(self, "_start_fingerprint", None) is None:
            from lightning_unlearn.models import weights_fingerprint

            self._start_fingerprint = weights_fingerprint(self.model_path)
        checkpoint["model_weights_fingerprint"] = self._start_fingerprint
        super().on_save_checkpoint(checkpoint)

    @override
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore AdaLoRA's rank allocator (when saved) and, for a resumed ``fit``, the RNG states.

        Args:
            checkpoint: the loaded checkpoint dict.
        """
        if self.adapter_config.kind == "adalora" and checkpoint.get("adalora"):
            self._restore_adalora_state(checkpoint["adalora"])
        super().on_load_checkpoint(checkpoint)

    # AdaLoRA's rank allocator keeps smoothed importance scores outside the state dict, and its rank pattern lives
    # in the peft config; without them a resumed run prunes different ranks than an uninterrupted one.
    _ADALORA_SCORES = ("ipt", "exp_avg_ipt", "exp_avg_unc")

    def _adalora_state(self) -> dict | None:
        from torch.distributed.tensor import DTensor

        allocator = self.model.base_model.rankallocator
        scores = {k: getattr(allocator, k) for k in self._ADALORA_SCORES}
        if any(isinstance(t, DTensor) for d in scores.values() for t in d.values()):
            warnings.warn(
                "AdaLoRA under FSDP: the rank allocator's importance scores are sharded and are not saved, so a "
                "run resumed from this checkpoint re-estimates them and can prune different ranks.",
                stacklevel=2,
            )
            return None
        config = self.model.peft_config[self.model.base_model.trainable_adapter_name]
        return {
            **{k: {n: t.detach().cpu().clone() for n, t in d.items()} for k, d in scores.items()},
            "rank_pattern": copy.deepcopy(config.rank_pattern),
        }

    def _restore_adalora_state(self, state: dict) -> None:
        allocator = self.model.base_model.rankallocator
        params = dict(self.model.base_model.model.named_parameters())  # the names the allocator uses
        for k in self._ADALORA_SCORES:
            setattr(allocator, k, {n: t.to(params[n].device) for n, t in state[k].items()})
        config = self.model.peft_config[self.model.base_model.trainable_adapter_name]
        config.rank_pattern = copy.deepcopy(state["rank_pattern"])

    def frozen_weight_keys(self) -> set[str]:
        """State-dict keys of the frozen parameters (with an adapter: the base model, reloaded from model_path)."""
        return {f"model.{n}" for n, p in self.model.named_parameters(remove_duplicate=False) if not p.requires_grad}

    @override
    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """With an adapter, accept checkpoints without the frozen base weights, and nothing else missing."""
        _ = self.model  # built (a Trainer built it already in configure_model)
        if self.adapter_config.kind == "full":
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        missing = sorted(set(result.missing_keys) - self.frozen_weight_keys())
        unexpected = sorted(k for k in result.unexpected_keys if not k.startswith("reference_model."))
        if missing or unexpected:
            raise RuntimeError(
                f"the checkpoint does not match this {type(self).__name__} with adapter.kind="
                f"{self.adapter_config.kind!r}: missing {missing[:5]}, unexpected {unexpected[:5]}. Load it with the "
                "adapter configuration (kind, r, target modules) it was trained with."
            )
        return result

    def adapter_dir(self) -> Path:
        """``<checkpoint dir>/adapter-step=N`` for the current optimizer step."""
        callback = self.trainer.checkpoint_callback
        root = getattr(callback, "dirpath", None) or os.path.join(self.trainer.default_root_dir, "checkpoints")
        return Path(root) / f"adapter-step={self.global_step}"

    def save_adapter(self, directory: str | os.PathLike) -> None:
        """Write the peft adapter (reloadable alone with ``PeftModel.from_pretrained``) atomically.

        Collective under FSDP (every rank gathers its shard); rank 0 writes.
        """
        state_dict = full_state_dict(self.model) if self._sharded else None
        if self.global_rank != 0:
            return
        write_directory_atomically(directory, lambda tmp: self.model.save_pretrained(str(tmp), state_dict=state_dict))
