"""OracleGrad (Lacuna Sec. 4.1): gradient difference whose every update stays inside the forget mask m^F.

L = γ·(−NLL̄(forget)) + α·NLL̄(retain) (Lacuna 1B: γ 5, α 1, lr 1e-4), with m^F the union of the forget groups
(ids 0-2, the paper's G_1-G_3) of the ground-truth packed masks.

- Full fine-tuning: the module exposes ``packed_masks`` and ``restrict_update_groups`` and a masked strategy
  (``lightning_unlearn.strategies.Masked{SingleDevice,DDP,FSDP}Strategy``) restricts every optimizer update
  (gradient, momentum, weight decay) to m^F; weights outside it stay bit-for-bit unchanged.
- LoRA: an adapter cannot be restricted element-wise, so each adapted linear layer computes
  ``W x + (m^F ⊙ s·B A) x``: the effective weight change is confined to m^F by construction. Such a delta is not a
  standard peft adapter, so instead of ``adapter-step=N`` each checkpoint writes the merged model
  (``W + m^F ⊙ s·B A``) as ``merged-step=N``, reloadable with ``from_pretrained``.
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from typing_extensions import override

from lightning_unlearn.atomic import write_directory_atomically
from lightning_unlearn.distributed import full_state_dict
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.losses import gd_loss
from lightning_unlearn.masks import canonical_name, group_mask, groups_in_mask, load_masks, validate_masks
from lightning_unlearn.models import AdapterConfig, load_causal_lm, unwrap_peft
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.unlearning_module import UnlearningModule, nonnegative_weights

FORGET_GROUPS = (0, 1, 2)


class OracleGrad(UnlearningModule):
    """Gradient difference restricted to the ground-truth forget mask.

    Args:
        model_path: local model directory (the injected model the masks belong to).
        masks_path: packed masks file (``masks.save_masks``) sampled for this model.
        adapter: full fine-tuning (restricted by the masked strategy) or LoRA (masked adapter delta).
        optim: optimizer and schedule.
        max_bad_loss: stop bound on the forget NLL (``None``: none).
        collapse_fraction: stop when the retain NLL reaches this fraction of ln |V| (``None``: never).
        forget_groups: group ids whose union is m^F.
        gamma: forget weight γ.
        alpha: retain weight α.

    Raises:
        ValueError: a negative or non-finite ``gamma`` / ``alpha``, masks made for another model, or
            ``forget_groups`` with no element in the masks.

    Example::

        >>> from lightning_unlearn.objectives import OracleGrad
        >>> # checked before the model or masks are read
        >>> OracleGrad("models/inj", "masks.safetensors", gamma=-5.0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_unlearn.errors.ConfigError: gamma=-5.0 must be a finite weight >= 0 ...
    """

    def __init__(
        self,
        model_path: str,
        masks_path: str,
        adapter: AdapterConfig | None = None,
        optim: OptimizerConfig | None = None,
        max_bad_loss: float | None = None,
        collapse_fraction: float | None = None,
        forget_groups: list[int] | None = None,
        gamma: float = 5.0,
        alpha: float = 1.0,
    ) -> None:
        nonnegative_weights(gamma=gamma, alpha=alpha)
        super().__init__(model_path, adapter, optim, max_bad_loss, collapse_fraction)
        self.save_hyperparameters()
        self.gamma, self.alpha = gamma, alpha
        self.forget_groups = list(FORGET_GROUPS if forget_groups is None else forget_groups)
        packed, _ = load_masks(masks_path)
        validate_masks(packed, load_causal_lm(model_path, weights=False))  # names and shapes, on a meta skeleton
        present = set().union(*(groups_in_mask(t) for t in packed.values()))
        if missing := sorted(set(self.forget_groups) - present):
            raise ConfigError(
                f"forget_groups {missing} have no element in the masks {masks_path!r} (its groups: {sorted(present)})."
            )
        self._masks = packed  # turned into the LoRA layers' masks once the model is built
        if self.adapter_config.kind == "full":
            # Read by the masked strategies (lightning_unlearn.strategies): restricted-update mode.
            self.packed_masks = packed
            self.restrict_update_groups = self.forget_groups
        else:
            self.packed_masks = None
            self.restrict_update_groups = None

    @override
    def on_model_built(self) -> None:
        """With LoRA, confine each adapted layer's weight change to m^F; then drop the masks kept for it."""
        if self.adapter_config.kind != "full":
            self._mask_lora_layers(self._masks)
        self._masks = None

    def _mask_lora_layers(self, packed: dict[str, torch.Tensor]) -> None:
        layers = [(n, m) for n, m in self.model.named_modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
        if not layers:
            raise ConfigError(f"adapter.kind={self.adapter_config.kind!r} produced no LoRA linear layer to mask.")
        for name, layer in layers:
            key = canonical_name(f"{name}.base_layer.weight")
            if key not in packed or tuple(packed[key].shape) != tuple(layer.base_layer.weight.shape):
                raise ConfigError(
                    f"masks do not match the model: no mask of shape {tuple(layer.base_layer.weight.shape)} "
                    f"for {key!r}. The masks file was made for another model."
                )
            # A buffer (not a parameter): FSDP2 keeps it whole on every rank, as the unsharded forward needs.
            layer.register_buffer("forget_mask", group_mask(packed[key], self.forget_groups), persistent=False)
            layer.forward = types.MethodType(_masked_lora_forward, layer)

    @override
    def setup(self, stage: str) -> None:
        """Check that every forget row belongs to ``forget_groups`` and that full fine-tuning has a masked strategy.

        Args:
            stage: the trainer's stage.

        Raises:
            ValueError: a forget row's ``group_ids`` is outside ``forget_groups``.
            TypeError: full fine-tuning without a masked strategy (``lightning_unlearn.strategies``).
        """
        forget = getattr(getattr(self.trainer, "datamodule", None), "forget", None)
        for row in getattr(forget, "rows", []):
            group = row.get("group_ids")
            if group is not None and group not in self.forget_groups:
                raise ConfigError(
                    f"forget row {row['index']} has group_id {group}, outside forget_groups {self.forget_groups}: "
                    "OracleGrad only updates the elements of those groups' masks (m^F), so it cannot unlearn that "
                    "row. Fix the forget set, or set forget_groups to the groups it holds."
                )
        if self.adapter_config.kind == "full" and not hasattr(self.trainer.strategy, "masked"):
            raise TypeError(
                f"OracleGrad with full fine-tuning needs a masked strategy to restrict updates to m^F, got "
                f"{type(self.trainer.strategy).__name__}. Set trainer.strategy to "
                "lightning_unlearn.strategies.MaskedSingleDeviceStrategy, MaskedDDPStrategy or MaskedFSDPStrategy."
            )

    @override
    def unlearning_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = γ·(−NLL̄(forget)) + α·NLL̄(retain), the update kept inside m^F by the strategy or the masked LoRA.

        Args:
            batch: ``{"forget": LM batch, "retain": LM batch}`` (``input_ids``, ``attention_mask``, ``labels``,
                each ``(B, T)``).

        Returns:
            ``(loss, {"forget_nll", "retain_nll"})``.
        """
        sums, logs = self.forget_retain_logps(batch)
        return gd_loss(*sums, self.gamma, self.alpha), logs

    @override
    def adapter_dir(self) -> Path:
        """``<checkpoint dir>/merged-step=N``: the merged model is written there instead of an adapter."""
        return super().adapter_dir().with_name(f"merged-step={self.global_step}")

    @override
    def save_adapter(self, directory: str | os.PathLike) -> None:
        """Write the merged model ``W + m^F ⊙ s·B A`` (collective under FSDP; rank 0 writes)."""
        state = (
            full_state_dict(self.model)
            if self._sharded
            else {k: v.detach() for k, v in self.model.state_dict().items()}
        )
        if self.global_rank != 0:
            return
        merged = merged_state_dict(self.model, state)

        def write(tmp: Path) -> None:
            unwrap_peft(self.model).save_pretrained(str(tmp), state_dict=merged)
            self.tokenizer.save_pretrained(str(tmp))

        write_directory_atomically(directory, write)


def load_merged_delta(model: nn.Module, directory: str | os.PathLike) -> int:
    """Make a peft-wrapped run network compute a ``merged-step=N/`` model, while ``disable_adapter()`` still gives
    the start model: every adapted linear layer adds the dense change ``W_merged − W`` while its adapter is enabled
    (its own LoRA factors no longer count). One process, unsharded. Returns the number of layers changed.

    The merged model may differ from the start model only in adapted layers (as OracleGrad's LoRA merge does);
    any other difference, or a missing weight, is refused.
    """
    from safetensors import safe_open

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise MissingPathError(f"{str(directory)!r} holds no *.safetensors file; it is not a merged-step model.")
    merged: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            merged.update({key: f.get_tensor(key) for key in f.keys()})  # noqa: SIM118 - safe_open is no dict
    adapted = {canonical_name(f"{name}.base_layer.weight"): layer for name, layer in model.named_modules()
               if hasattr(layer, "lora_A") and hasattr(layer, "base_layer")}  # fmt: skip
    changed = 0
    for name, param in model.named_parameters():
        if ".lora_" in name:
            continue
        if type(param.data).__name__ == "DTensor":
            raise NotImplementedError("load_merged_delta needs unsharded parameters (one process, no FSDP).")
        key = canonical_name(name)
        if key not in merged:
            raise ConfigError(
                f"{str(directory)!r} lacks the weight {key} of the configured model; it was merged from another "
                "model. Evaluate it with the config of the run that wrote it."
            )
        target = merged[key].to(param.device, param.dtype)
        layer = adapted.get(key)
        if layer is None:
            if not torch.equal(target, param.detach()):
                raise ConfigError(
                    f"{str(directory)!r} changes {key}, which the configured model does not adapt; only a model "
                    "merged from this run's adapter can be evaluated this way."
                )
            continue
        delta = (target.float() - param.detach().float()).to(param.dtype)
        layer.register_buffer("merged_delta", delta, persistent=False)
        layer.forward = types.MethodType(_merged_delta_forward, layer)
        changed += 1
    return changed


def _merged_delta_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """An adapted linear layer evaluated as a merged model: ``W x`` plus the dense change while adapters are on."""
    result = self.base_layer(x, *args, **kwargs)
    if self.disable_adapters:
        return result
    return result + F.linear(x, self.merged_delta.to(x.dtype))


def _masked_lora_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """peft ``lora.Linear.forward`` with the weight delta s·B A multiplied by this layer's ``forget_mask``."""
    result = self.base_layer(x, *args, **kwargs)
    if self.disable_adapters:
        return result
    for name in self.active_adapters:
        if name not in self.lora_A:
            continue
        delta = (self.lora_B[name].weight @ self.lora_A[name].weight) * self.scaling[name] * self.forget_mask
        result = result + F.linear(self.lora_dropout[name](x), delta.to(x.dtype))
    return result


@torch.no_grad()
def merged_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full-model weights ``W + m^F ⊙ s·B A`` under the bare model's names, from a peft model's full state dict."""
    merged = {canonical_name(k): v.clone() for k, v in state.items() if ".lora_" not in k}
    for name, layer in model.named_modules():
        if not (hasattr(layer, "lora_A") and hasattr(layer, "forget_mask")):
            continue
        key = canonical_name(f"{name}.base_layer.weight")
        for adapter in layer.active_adapters:
            a = state[f"{name}.lora_A.{adapter}.weight"].float()
            b = state[f"{name}.lora_B.{adapter}.weight"].float()
            delta = (b @ a) * layer.scaling[adapter] * layer.forget_mask.cpu()
            merged[key] = (merged[key].float() + delta).to(merged[key].dtype)
    return merged
