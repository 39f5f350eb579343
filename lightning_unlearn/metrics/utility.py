"""Multiple-choice utility: accuracy where the predicted option is the one with the highest log-likelihood.

Items are ``{"question": str, "choices": [str, ...], "answer": int | str}`` — ``answer`` is the 0-based index,
a letter ``"A"``/``"B"``… or the text of the right choice. The prompt is ``"{question}\\nAnswer:"`` and each option
is scored as the answer ``" {choice}"`` (sum of its token log-probs; ``length_normalize`` divides by its length).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import torch

from lightning_unlearn.data.collate import encode_prompt_answer, pad_batch
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.losses import sequence_logprobs


def load_multiple_choice(path: str | os.PathLike) -> list[dict]:
    """Read and validate a JSONL of multiple-choice items; answers are normalized to 0-based indices."""
    if not os.path.exists(path):
        raise MissingPathError(f"multiple-choice file {str(path)!r} does not exist.")
    items = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                items.append(normalize_item(json.loads(line), where=f"{path}:{lineno}"))
    if not items:
        raise ConfigError(f"multiple-choice file {str(path)!r} holds no items.")
    return items


def normalize_item(item: dict, where: str = "item") -> dict:
    """``item`` with ``answer`` as a 0-based index; raises naming ``where`` if a field is missing or wrong."""
    for key in ("question", "choices", "answer"):
        if key not in item:
            raise ConfigError(f"{where}: missing field {key!r}; items are {{question, choices, answer}}.")
    choices = list(item["choices"])
    if len(choices) < 2:
        raise ConfigError(f"{where}: needs at least two choices, got {len(choices)}.")
    ans = item["answer"]
    if isinstance(ans, str):
        if ans in choices:  # the text of a choice wins over reading it as a letter
            ans = choices.index(ans)
        elif len(ans) == 1 and ans.isalpha():
            ans = ord(ans.upper()) - ord("A")
        else:
            raise ConfigError(f"{where}: answer {item['answer']!r} is neither a letter, an index nor a choice.")
    if not isinstance(ans, int) or not 0 <= ans < len(choices):
        raise ConfigError(f"{where}: answer {item['answer']!r} is out of range for {len(choices)} choices.")
    return {"question": item["question"], "choices": choices, "answer": ans}


def mc_prompt(question: str) -> str:
    """The text each option of a multiple-choice question is scored after: the question, a newline, ``Answer:``."""
    return f"{question}\nAnswer:"


@torch.no_grad()
def option_logprobs(
    model,
    tokenizer,
    items: Sequence[dict],
    batch_size: int = 16,
    max_length: int = 256,
    length_normalize: bool = False,
) -> list[list[float]]:
    """Per item, the log-likelihood of each choice given the question (teacher-forced, right-padded batches)."""
    device = next(model.parameters()).device
    rows, owner = [], []
    for i, it in enumerate(items):
        for c in it["choices"]:
            rows.append(encode_prompt_answer(tokenizer, mc_prompt(it["question"]), f" {c}", max_length))
            owner.append(i)
    scores: list[float] = []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for s in range(0, len(rows), batch_size):
        batch = pad_batch(rows[s : s + batch_size], pad)
        ids, attn = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        logits = model(input_ids=ids, attention_mask=attn).logits
        logp, n = sequence_logprobs(logits.cpu(), batch["labels"])
        scores.extend((logp / n if length_normalize else logp).tolist())
    per_item: list[list[float]] = [[] for _ in items]
    for i, sc in zip(owner, scores):
        per_item[i].append(sc)
    return per_item


def multiple_choice_accuracy(option_scores: Sequence[Sequence[float]], answers: Sequence[int]) -> float:
    """Share of items whose highest-scoring option is the answer (ties go to the first option)."""
    if not option_scores:
        raise ConfigError("multiple_choice_accuracy needs at least one item.")
    hits = [max(range(len(s)), key=lambda j, s=s: (s[j], -j)) == a for s, a in zip(option_scores, answers)]
    return sum(hits) / len(hits)
