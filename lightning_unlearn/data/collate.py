"""Tokenisation and padding shared by every datamodule.

A prompt/answer pair becomes ``input_ids = prompt + answer + eos`` with ``labels`` equal to ``input_ids`` on the
answer (and eos) and ``IGNORE_INDEX`` on the prompt, so losses see answer tokens only. Plain documents
(continual pretraining) have every token as a label.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import IGNORE_INDEX


def encode_prompt_answer(
    tokenizer, prompt: str, answer: str, max_length: int, chat_template: bool = False
) -> dict[str, list[int]]:
    """Token ids and labels for one pair; the prompt is truncated from the left if the pair is too long.

    ``chat_template`` renders the prompt as a user turn of the tokenizer's chat template
    (:func:`lightning_unlearn.generation.model_prompt`, the rendering generation uses), so the answer is the
    assistant's reply.
    """
    return encode_pair_with_cuts(tokenizer, prompt, answer, max_length, chat_template)[0]


def encode_pair_with_cuts(
    tokenizer, prompt: str, answer: str, max_length: int, chat_template: bool = False
) -> tuple[dict[str, list[int]], int, int]:
    """:func:`encode_prompt_answer` and how many prompt and answer tokens ``max_length`` cut off: ``(row,
    prompt_cut, answer_cut)``. The answer (with its EOS) is cut first to leave room for the BOS and one prompt
    token, then the prompt from the left."""
    if chat_template:
        from lightning_unlearn.generation import model_prompt

        prompt = model_prompt(tokenizer, prompt, chat_template=True)
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    a = encode_answer(tokenizer, answer)
    full_p, full_a = len(p), len(a)
    a = a[: max_length - len(bos) - 1]
    p = p[max(0, len(p) - (max_length - len(bos) - len(a))) :]
    ids = bos + p + a
    labels = [IGNORE_INDEX] * (len(bos) + len(p)) + a
    return {"input_ids": ids, "labels": labels}, full_p - len(p), full_a - len(a)


def encode_answer(tokenizer, answer: str) -> list[int]:
    """The token ids an answer takes in a pair: its tokens (no special tokens) and the EOS."""
    return tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def with_answers(batch: dict, answers: Sequence[Sequence[int]], pad_token_id: int) -> dict:
    """``batch``'s prompts with other answers: row i = its prompt tokens (BOS included, padding dropped) followed by
    ``answers[i]`` (token ids ending in EOS, see :func:`encode_answer`), labelled on the answer only, right-padded.

    A row equals :func:`encode_prompt_answer` of the same prompt and new answer whenever ``max_length`` did not cut
    it (the new pair is not cut again). Other per-row fields (``index``, ``group_ids``) are kept; tensors are on the
    batch's device.

    Args:
        batch: an LM batch (``input_ids``, ``labels``, ``attention_mask``; ``(B, T)``).
        answers: ``B`` token-id lists.
        pad_token_id: the tokenizer's pad id.
    """
    if len(answers) != len(batch["input_ids"]):
        raise ConfigError(f"{len(answers)} answers for a batch of {len(batch['input_ids'])} rows; give one per row.")
    rows = []
    for ids, labels, attention, answer in zip(batch["input_ids"], batch["labels"], batch["attention_mask"], answers):
        labelled = (labels != IGNORE_INDEX).nonzero()
        if len(labelled) == 0:
            raise ConfigError("a batch row has no answer token, so where its prompt ends is unknown.")
        start = int(labelled[0])  # the first answer token; the prompt is everything unpadded before it
        prompt = ids[:start][attention[:start].bool()].tolist()
        rows.append({"input_ids": prompt + list(answer), "labels": [IGNORE_INDEX] * len(prompt) + list(answer)})
    out = {k: v.to(batch["input_ids"].device) for k, v in pad_batch(rows, pad_token_id).items()}
    return {**{k: v for k, v in batch.items() if k not in out}, **out}


def encode_document(tokenizer, text: str, max_length: int) -> dict[str, list[int]]:
    """Token ids for a pretraining document; every token is a label."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    ids = (bos + tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])[:max_length]
    return {"input_ids": ids, "labels": list(ids)}


def pad_batch(rows: Sequence[dict], pad_token_id: int, padding_side: str = "right") -> dict[str, torch.Tensor]:
    """Pad ``input_ids``/``labels`` rows into tensors with an ``attention_mask``; other keys are stacked.

    Integer/float per-row fields (e.g. ``group_ids``, ``profile_id``) become 1-D tensors; strings stay lists.
    """
    if not rows:
        raise ConfigError("cannot collate an empty batch.")
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        sl = slice(0, n) if padding_side == "right" else slice(width - n, width)
        ids[i, sl] = torch.tensor(r["input_ids"])
        labels[i, sl] = torch.tensor(r["labels"])
        attn[i, sl] = 1
    batch: dict = {"input_ids": ids, "labels": labels, "attention_mask": attn}
    for key in rows[0]:
        if key in batch:
            continue
        values = [r[key] for r in rows]
        if all(isinstance(v, bool | int) for v in values):
            batch[key] = torch.tensor(values, dtype=torch.long)
        elif all(isinstance(v, float) for v in values):
            batch[key] = torch.tensor(values)
        else:
            batch[key] = values
    return batch
