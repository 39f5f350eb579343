"""RMU, representation misdirection for unlearning (Li et al. 2024, "The WMDP Benchmark", Sec. 5, Algorithm 1).

L = γ·mean_t (1/d)·‖h_ℓ,t(x_f) − c·u‖² + α·mean_t (1/d)·‖h_ℓ,t(x_r) − h_ℓ,t^frozen(x_r)‖², h_ℓ = the output of block ℓ,
u a fixed random unit vector, only blocks ℓ−2…ℓ's MLP down-projections updated. OpenUnlearning's WMDP experiment:
ℓ 7, blocks 5–7 ``mlp.down_proj.weight``, c 2, α 1, γ 1, lr 5e-5.
"""

from __future__ import annotations

import dataclasses
import logging
import re

import torch
from torch import nn
from transformers import AutoConfig
from typing_extensions import override

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import (
    RMU_POSITIONS,
    TOKEN_AVERAGES,
    check_choice,
    normalized_nll,
    rmu_control_vector,
    rmu_forget_loss,
    rmu_positions,
    rmu_retain_loss,
    sequence_logprobs,
)
from lightning_unlearn.models import AdapterConfig, block_index_pattern, block_output
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule, nonnegative_weights

log = logging.getLogger("lightning_unlearn")


class RMU(UnlearningModule):
    """Steer block ℓ's hidden states on forget text toward c·u; keep them on retain text.

    Which parameters train: with full fine-tuning, the parameters of blocks ``updated_layers`` whose name inside the
    block starts with one of ``updated_params`` (all others get ``requires_grad=False`` and stay out of the
    optimizer); with LoRA / AdaLoRA, an adapter config that leaves ``layers`` / ``target_modules`` unset gets
    ``updated_layers`` / ``updated_params`` there (set them to override). The frozen reference for the retain term
    is the start model: LoRA's adapter disabled, or a frozen copy with full fine-tuning. u is a buffer
    (``control_vector``, = c·u) drawn from ``steering_seed``: the same on every rank, and saved in checkpoints, so a
    resumed run steers toward the checkpoint's u whatever ``steering_seed`` says.

    Args:
        model_path: local model directory.
        adapter: full fine-tuning, LoRA or AdaLoRA.
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        layer: block ℓ (0-based) whose output h_ℓ both terms read (OpenUnlearning's ``module_regex``
            ``model.layers.7``).
        updated_layers: blocks whose parameters train; ``None`` = ℓ−2, ℓ−1, ℓ (the reference code's). Blocks after
            ℓ cannot change h_ℓ and are refused.
        updated_params: name prefixes inside a block of the parameters that train (``mlp.down_proj``: the reference
            code's ``param_ids [6]``; ``mlp`` for the whole MLP); ``None`` = every parameter of those blocks.
        restrict_updates: ``False`` trains every parameter (OpenUnlearning's trainer default ``.*``, as G-effect
            does) and leaves an adapter config as it is.
        steering_coeff: c, the norm of the forget target.
        alpha: weight α of the retain term.
        gamma: weight γ of the forget term.
        steering_seed: seed of u (not ``seed``: the datamodule's ``seed`` shares the run's hyperparameters, and
            Lightning refuses two different values under one name).
        token_average: ``sequence`` (default: each sequence weighs the same, OpenUnlearning's intent) or ``batch``
            (each position weighs the same, the WMDP reference code's ``mse_loss``).
        positions: ``answer`` (default, OpenUnlearning's: answer-token positions) or ``all`` (every non-padding
            position, prompt included, the WMDP reference code's on plain text).

    Raises:
        ValueError: a negative or non-finite ``alpha`` / ``gamma``, an unknown ``token_average`` /
            ``positions``, a ``layer`` that is no block of the model, or ``updated_layers`` after ``layer``.

    Example::

        >>> from lightning_unlearn.losses import rmu_control_vector
        >>> u = rmu_control_vector(hidden_size=4, steering_coeff=2.0, seed=0)  # RMU's target c·u
        >>> u.norm()  # c: the forget activations are pushed toward a vector of this norm
        tensor(2.)
    """

    needs_reference = True

    def __init__(
        self,
        model_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        collapse_fraction: float | None = None,
        layer: int = 7,
        updated_layers: list[int] | None = None,
        updated_params: tuple[str, ...] | None = ("mlp.down_proj",),
        restrict_updates: bool = True,
        steering_coeff: float = 2.0,
        alpha: float = 1.0,
        gamma: float = 1.0,
        steering_seed: int = 0,
        token_average: str = "sequence",
        positions: str = "answer",
    ) -> None:
        nonnegative_weights(alpha=alpha, gamma=gamma)
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        self.save_hyperparameters()
        check_choice("token_average", token_average, TOKEN_AVERAGES)
        check_choice("positions", positions, RMU_POSITIONS)
        config = AutoConfig.from_pretrained(model_path, local_files_only=True)
        num_blocks = config.num_hidden_layers
        if not 0 <= layer < num_blocks:
            raise ConfigError(f"RMU layer={layer} is not a block of {model_path} (blocks 0–{num_blocks - 1}).")
        updated = [i for i in (layer - 2, layer - 1, layer) if i >= 0] if updated_layers is None else updated_layers
        if not updated or any(not 0 <= i <= layer for i in updated):
            raise ConfigError(
                f"RMU updated_layers={list(updated)}: give blocks in 0–{layer} (layer={layer}); blocks after ℓ "
                "do not change h_ℓ."
            )
        self.layer, self.updated_layers = layer, sorted(set(updated))
        self.updated_params = None if updated_params is None else list(updated_params)
        self.restrict_updates = restrict_updates
        self.steering_coeff, self.alpha, self.gamma = steering_coeff, alpha, gamma
        self.token_average, self.positions = token_average, positions
        self.register_buffer("control_vector", rmu_control_vector(config.hidden_size, steering_coeff, steering_seed))
        if restrict_updates and self.adapter_config.kind != "full" and self.adapter_config.path is None:
            self.adapter_config = self._restricted_adapter(self.adapter_config)

    def _restricted_adapter(self, adapter: AdapterConfig) -> AdapterConfig:
        targets = adapter.target_modules
        if targets is None and self.updated_params is not None:
            targets = [re.sub(r"\.(weight|bias)$", "", p) for p in self.updated_params]
        layers = self.updated_layers if adapter.layers is None else adapter.layers
        log.info("RMU: adapters on blocks %s, modules %s", layers, targets or "all linear")
        return dataclasses.replace(adapter, layers=layers, target_modules=targets)

    @override
    def on_model_built(self) -> None:
        """Full fine-tuning, ``restrict_updates``: train only ``updated_params`` of ``updated_layers``; freeze the rest.

        Raises:
            ValueError: no parameter of those blocks matches ``updated_params``.
        """
        if not self.restrict_updates or self.adapter_config.kind != "full":
            return
        pattern, _ = block_index_pattern(self.model)
        chosen = []
        for name, param in self.model.named_parameters():
            match = pattern.search(name)
            inside = name[match.end() :] if match else None
            train = (
                match is not None
                and int(match.group(1)) in self.updated_layers
                and (self.updated_params is None or any(inside.startswith(p) for p in self.updated_params))
            )
            param.requires_grad_(train)
            if train:
                chosen.append(name)
        if not chosen:
            raise ConfigError(
                f"RMU: no parameter of blocks {self.updated_layers} starts with {self.updated_params}; name "
                "parameters as they appear inside a block (e.g. mlp.down_proj)."
            )

    def _forward(self, network: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """``(block-ℓ output (B, T, d), logits (B, T, V))`` of ``network`` on ``batch``."""
        with block_output(network, self.layer) as captured:
            logits = network(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return captured[0], logits

    @torch.no_grad()
    def _frozen_hidden(self, batch: dict) -> torch.Tensor:
        policy = self.model
        if self.reference_model is not None:
            return self._forward(self.reference_model, batch)[0]
        with policy.disable_adapter():
            return self._forward(policy, batch)[0]

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = γ·mean ‖h_ℓ(forget) − c·u‖²/d + α·mean ‖h_ℓ(retain) − h_ℓ^frozen(retain)‖²/d.

        Args:
            batch: ``{"forget": LM batch, "retain": LM batch}`` (``input_ids``, ``attention_mask``, ``labels``,
                each ``(B, T)``).

        Returns:
            ``(loss, {"forget_nll", "retain_nll", "rmu_forget_loss", "rmu_retain_loss"})``.
        """
        forget, retain = batch["forget"], batch["retain"]
        f_hidden, f_logits = self._forward(self.model, forget)
        r_hidden, r_logits = self._forward(self.model, retain)
        frozen = self._frozen_hidden(retain)
        f_mask = rmu_positions(forget["labels"], forget["attention_mask"], self.positions)
        r_mask = rmu_positions(retain["labels"], retain["attention_mask"], self.positions)
        control = self.control_vector.to(f_hidden.device)
        forget_term = rmu_forget_loss(f_hidden, control, f_mask, self.token_average)
        retain_term = rmu_retain_loss(r_hidden, frozen, r_mask, self.token_average)
        with torch.no_grad():
            f_logps, f_len = sequence_logprobs(f_logits, forget["labels"])
            r_logps, r_len = sequence_logprobs(r_logits, retain["labels"])
        return self.gamma * forget_term + self.alpha * retain_term, {
            "forget_nll": normalized_nll(f_logps, f_len).mean(),
            "retain_nll": normalized_nll(r_logps, r_len).mean(),
            "rmu_forget_loss": forget_term.detach(),
            "rmu_retain_loss": retain_term.detach(),
        }
