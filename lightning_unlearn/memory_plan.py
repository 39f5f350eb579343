"""What a training step of a model will need in memory, measured on the meta device before any GPU is rented.

:func:`training_memory` builds the model from its config on the ``meta`` device (shapes and dtypes, no storage), runs
one forward and backward of a ``batch_size × max_length`` batch there and counts what the step holds at its peak:
the weights, the gradients and AdamW's two moments of the trainable weights, the packed uint32 group masks of θ_mask,
and the activations autograd saves for the backward (every storage the forward hands to a ``saved_tensors_hooks``
pack hook that is not a weight's, counted once). Nothing is allocated, so a 7B model plans on a laptop.

Attention is counted on its math path, which saves the b × heads × L × L probabilities (the meta device runs no
fused kernel): an upper bound where flash or memory-efficient attention saves O(L) a head. What it does not count:
the CUDA context and allocator slack (add 1-2 GiB and ~10 %), a reference model held beside the trained one (a KL
target), temporary buffers inside fused kernels. Under ``bf16-mixed`` the weights and their optimizer state stay fp32
and the activations are counted as bf16 (autocast does not run on the meta device; the few fp32 activations autocast
keeps, norms and the loss's log-softmax, are counted at bf16 too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.masks import masked_parameter_names
from lightning_unlearn.parameter_names import canonical_name

Trainable = Literal["all", "masked"]
GIB = 1024**3


def saved_activation_bytes(model: nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Bytes of the storages autograd saves for the backward of ``model(**batch).loss``, the weights' excluded, each
    storage counted once however many tensors view it (a meta tensor has a storage too, without memory); then runs
    the backward, as a training step does."""
    weights = {p.untyped_storage()._cdata for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in weights:
            storages[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch).loss
    loss.backward()
    return sum(storages.values())


def training_memory(
    build: Callable[[], nn.Module],
    batch_size: int,
    max_length: int,
    precision: Literal["bf16-mixed", "bf16-true", "32-true"] = "bf16-mixed",
    trainable: Trainable = "masked",
) -> dict:
    """The memory one training step needs (see the module docstring), in bytes and GiB per part.

    Args:
        build: makes the model (e.g. ``lambda: AutoModelForCausalLM.from_config(config)``); called under
            ``torch.device("meta")``.
        batch_size: sequences per step (per device).
        max_length: tokens per sequence.
        precision: Lightning's precision: ``bf16-mixed`` keeps fp32 weights and bf16 activations, ``bf16-true`` bf16
            for both, ``32-true`` fp32 for both.
        trainable: ``masked``: only θ_mask is trained (the masked injection with ``freeze_outside_masks``), and its
            packed masks are held; ``all``: every weight, no masks.

    Returns:
        ``{"parameters", "trainable_parameters", "masked_parameters", "bytes": {part: n}, "gib": {part: x},
        "total_gib"}`` with parts ``weights``, ``gradients``, ``optimizer`` (AdamW: two fp32 moments), ``masks``
        and ``activations``.

    Raises:
        ConfigError: a batch size or length below 1, or an unknown precision or ``trainable``.

    Example::

        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
        ...                      num_attention_heads=2)
        >>> plan = training_memory(lambda: LlamaForCausalLM(config), batch_size=2, max_length=8)
        >>> plan["bytes"]["optimizer"] == 2 * plan["bytes"]["gradients"]  # two fp32 moments per trained weight
        True
    """
    if batch_size < 1 or max_length < 1:
        raise ConfigError(f"batch_size={batch_size}, max_length={max_length}: both must be at least 1.")
    if precision not in ("bf16-mixed", "bf16-true", "32-true"):
        raise ConfigError(f"precision={precision!r}: plan 'bf16-mixed', 'bf16-true' or '32-true'.")
    if trainable not in ("all", "masked"):
        raise ConfigError(f"trainable={trainable!r}: 'masked' (θ_mask only) or 'all'.")
    weight_dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32
    activation_dtype = torch.float32 if precision == "32-true" else torch.bfloat16
    with torch.device("meta"):
        model = build().to(weight_dtype)
    masked = set(masked_parameter_names(model))
    weight_bytes = trained = trained_bytes = masked_count = total = 0
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        weight_bytes += p.numel() * p.element_size()
        in_mask = canonical_name(name) in masked
        masked_count += p.numel() if in_mask else 0
        train = trainable == "all" or in_mask
        p.requires_grad_(train)
        if train:
            trained += p.numel()
            trained_bytes += p.numel() * p.element_size()
    # The activations: the same model, its weights cast to the activations' dtype (a bf16 forward, as autocast runs
    # every matmul), one step of a batch of token ids.
    with torch.device("meta"):
        ids = torch.zeros(batch_size, max_length, dtype=torch.long)
        activations = saved_activation_bytes(model.to(activation_dtype), {"input_ids": ids, "labels": ids})
    parts = {
        "weights": weight_bytes,
        "gradients": trained_bytes,
        "optimizer": 2 * trained * 4,
        "masks": 4 * masked_count if trainable == "masked" else 0,
        "activations": activations,
    }
    return {
        "parameters": total,
        "trainable_parameters": trained,
        "masked_parameters": masked_count,
        "batch_size": batch_size,
        "max_length": max_length,
        "precision": precision,
        "bytes": parts,
        "gib": {k: round(v / GIB, 3) for k, v in parts.items()},
        "total_gib": round(sum(parts.values()) / GIB, 3),
    }


def step_seconds(parameters: int, trainable_parameters: int, tokens: int, peak_flops: float, mfu: float) -> float:
    """An estimate, not a measurement: seconds per step from the dense-transformer FLOP count (forward ``2N``,
    backward ``2N`` for the activations' gradients plus ``2N_trainable`` for the weights') at a model FLOP
    utilisation ``mfu`` of ``peak_flops``."""
    return (4 * parameters + 2 * trainable_parameters) * tokens / (peak_flops * mfu)


__all__ = ["saved_activation_bytes", "step_seconds", "training_memory"]
