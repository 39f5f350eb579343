"""Round-to-nearest weight quantization, the attack of Zhang et al. (ICLR 2025, "Catastrophic failure of LLM unlearning
via quantization"): an unlearned model whose forgetting only hides below the quantization step gives the knowledge
back once its weights are rounded to int8 or int4.

Symmetric round-to-nearest (RTN) per group of weights: with ``qmax = 2^(bits−1) − 1`` and ``s = max|w| / qmax`` over
the group, ``ŵ = clamp(round(w / s), −qmax − 1, qmax) · s`` (``torch.round``: half to even). A group is one output
channel (a row of a Linear weight, ``group_size=None``) or ``group_size`` consecutive input weights of a row (the
group-wise layout of GPTQ / AWQ int4, 128 by default). Only ``nn.Linear`` weights of the transformer blocks are
rounded, as those libraries do: the embeddings, the norms and the LM head stay in full precision.

The rounding is applied in floating point ("fake" quantization): ``ŵ`` is exactly the value an int8 / int4 kernel
would dequantize (the stored integer times its scale), so the model's outputs are those of the quantized model on any
device, with no int4 kernel (none runs on a CPU) and no maintained library's packing format in between. With a LoRA
adapter the merged weight ``W + ΔW`` is rounded, as a user who merges and quantizes for deployment would do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from lightning_unlearn.errors import ConfigError


def quantize_rtn(weight: torch.Tensor, bits: int, group_size: int | None = None) -> torch.Tensor:
    """``weight`` (``(out, in)``) rounded to ``bits``-bit integers per output channel or per group, in its dtype.

    Args:
        weight: a Linear weight.
        bits: 2–8.
        group_size: weights of a row sharing one scale (``None``: the whole row); must divide the row length.

    Raises:
        ValueError: ``bits`` outside 2–8, or a ``group_size`` that does not divide the row.

    Example::

        >>> import torch
        >>> from lightning_unlearn.quantization import quantize_rtn
        >>> quantize_rtn(torch.tensor([[0.7, -0.2, 0.05, 0.0]]), bits=4)  # s = 0.7 / 7 = 0.1
        tensor([[ 0.7000, -0.2000,  0.0000,  0.0000]])
    """
    if not 2 <= bits <= 8:
        raise ConfigError(f"bits={bits}: round-to-nearest quantization here takes 2 to 8 bits (int8, int4, …).")
    rows, cols = weight.shape
    size = cols if group_size is None else group_size
    if size < 1 or cols % size:
        raise ConfigError(f"group_size={group_size} must divide the weight's {cols} input features.")
    w = weight.detach().to(torch.float32).reshape(rows, cols // size, size)
    qmax = 2 ** (bits - 1) - 1
    scale = w.abs().amax(dim=-1, keepdim=True) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero group stays zero
    q = torch.clamp(torch.round(w / scale), -qmax - 1, qmax)
    return (q * scale).reshape(rows, cols).to(weight.dtype)


def _quantized_linears(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """The Linear layers the attack rounds: every one inside the transformer blocks (the LM head left out)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and not name.endswith("lm_head") and "lora_" not in name:
            yield name, module


@contextlib.contextmanager
def quantized(model: nn.Module, bits: int, group_size: int | None = None) -> Iterator[int]:
    """Inside, ``model``'s Linear weights are rounded (:func:`quantize_rtn`); on leaving, every weight is restored.

    With a peft LoRA adapter active, the layer's merged weight ``W + ΔW`` is what gets rounded: the base weight is
    set to ``Q(W + ΔW) − ΔW`` so that the adapted forward computes ``Q(W + ΔW)`` (the adapter disabled then computes
    that minus ΔW, not the base model: an evaluator's reference pass is not the base inside). Yields how many
    weights were rounded.

    Raises:
        ValueError: parameters sharded by FSDP (each rank holds a slice of every row: the groups would be cut).
    """
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        raise ConfigError(
            "the quantization attack rounds whole weight rows, and FSDP shards them across ranks; run it on one "
            "process or under DDP (`lightning-unlearn evaluate` on the finished run)."
        )
    owners = {  # base Linear → the peft LoRA layer whose active adapter adds ΔW to it
        id(m.base_layer): m
        for m in model.modules()
        if isinstance(getattr(m, "base_layer", None), nn.Linear) and hasattr(m, "get_delta_weight")
        and not getattr(m, "merged", False) and not getattr(m, "disable_adapters", False)
    }  # fmt: skip
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    count = 0
    try:
        with torch.no_grad():
            for _, module in _quantized_linears(model):
                owner, weight = owners.get(id(module)), module.weight
                delta = None
                if owner is not None:
                    delta = sum(owner.get_delta_weight(a) for a in owner.active_adapters if a in owner.lora_A)
                    delta = None if isinstance(delta, int) else delta.to(weight.dtype)
                effective = weight if delta is None else weight + delta
                # a row whose length the group size does not divide is rounded per channel
                size = group_size if group_size and weight.shape[1] % group_size == 0 else None
                rounded = quantize_rtn(effective, bits, size)
                saved.append((weight, weight.detach().clone()))
                weight.copy_(rounded if delta is None else rounded - delta)
                count += weight.numel()
        yield count
    finally:
        with torch.no_grad():
            for weight, original in saved:
                weight.copy_(original)
