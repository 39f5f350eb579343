"""Teacher-forced batches of prompt/answer records (read by :func:`lightning_unlearn.data.records.read_records`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lightning_unlearn.data.collate import encode_prompt_answer, pad_batch
from lightning_unlearn.generation import pad_token_id


def encode_batch(
    tokenizer, records: Sequence[dict], max_length: int, chat_template: bool = False
) -> dict[str, torch.Tensor]:
    """Right-padded LM batch with labels on the answer only (prompts rendered as training renders them)."""
    rows = [encode_prompt_answer(tokenizer, r["prompt"], r["answer"], max_length, chat_template) for r in records]
    batch = pad_batch(rows, pad_token_id(tokenizer))
    return {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}


def forward_logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's logits for a teacher-forced batch, as float32 on the CPU.

    Args:
        model: a causal LM; the batch is moved to the device of its first parameter.
        batch: ``input_ids`` and ``attention_mask``, ``(B, T)``, as :func:`encode_batch` returns them.

    Returns:
        ``(B, T, V)`` float32 logits on the CPU.
    """
    device = next(model.parameters()).device
    out = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
    return out.logits.float().cpu()
