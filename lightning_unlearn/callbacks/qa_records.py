"""Prompt/answer records for teacher-forced evaluation, from lists or JSONL files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from lightning_unlearn.data.collate import encode_prompt_answer, pad_batch
from lightning_unlearn.generation import pad_token_id


def load_qa_records(records: Sequence[dict] | str, what: str) -> list[dict]:
    """``[{"prompt", "answer", ...}]`` from a list or a JSONL file; ``what`` names the set in errors."""
    if isinstance(records, str | Path):
        path = Path(records)
        if not path.exists():
            raise FileNotFoundError(f"{what} file {str(path)!r} does not exist.")
        records = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    records = [dict(r) for r in records]
    if not records:
        raise ValueError(f"the {what} set is empty; pass at least one {{prompt, answer}} record.")
    for i, r in enumerate(records):
        if "prompt" not in r or "answer" not in r:
            raise ValueError(f"{what} record {i} needs `prompt` and `answer`, got keys {sorted(r)}.")
    return records


def encode_batch(tokenizer, records: Sequence[dict], max_length: int) -> dict[str, torch.Tensor]:
    """Right-padded LM batch with labels on the answer only."""
    rows = [encode_prompt_answer(tokenizer, r["prompt"], r["answer"], max_length) for r in records]
    batch = pad_batch(rows, pad_token_id(tokenizer))
    return {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}


def forward_logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    device = next(model.parameters()).device
    out = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
    return out.logits.float().cpu()
