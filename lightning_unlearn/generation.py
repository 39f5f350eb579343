"""Batched greedy generation with left padding and the KV cache, and the one rendering of a question as a model
prompt; used by every generation-based metric and workflow."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm


@dataclass
class Generation:
    """One greedy answer.

    Args:
        text: the decoded answer (prompt removed, special tokens skipped).
        num_tokens: generated tokens up to and including the first end-of-sequence.
        hit_token_cap: generation stopped at ``max_new_tokens`` without an end-of-sequence.
    """

    text: str
    num_tokens: int
    hit_token_cap: bool


def encode_prompts_left_padded(tokenizer, prompts: Sequence[str], max_prompt_tokens: int | None = None):
    """``(input_ids, attention_mask)`` ``(B, T)`` with padding on the left so all prompts end at column T−1.

    A BOS is prepended when the tokenizer has one (as in training collation); long prompts keep their end.
    """
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    rows = []
    for p in prompts:
        ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        if max_prompt_tokens is not None:
            ids = ids[-(max_prompt_tokens - len(bos)) :]
        rows.append(bos + ids)
    pad = pad_token_id(tokenizer)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, width - len(r) :] = torch.tensor(r)
        attention_mask[i, width - len(r) :] = 1
    return input_ids, attention_mask


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id, falling back to EOS (generation only ever attends to real tokens)."""
    pid = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pid is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token before generating.")
    return int(pid)


@torch.no_grad()
def generate_greedy(
    model,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int = 64,
    synced_gpus: bool = False,
    max_prompt_tokens: int | None = None,
) -> list[Generation]:
    """Greedy answers for one batch of prompts: left-padded, one token per step with the KV cache.

    The loop calls ``model(...)`` itself (rather than ``generate``) so every step enters the top-level module:
    under FSDP2 that is where the root parameters are gathered, even when the model is peft-wrapped.
    Position ids count real tokens only, so a left-padded prompt is encoded exactly as it is alone.

    Args:
        model: a transformers (or peft) causal LM.
        tokenizer: its tokenizer.
        prompts: the batch (the caller chooses the batch size).
        max_new_tokens: the token cap.
        synced_gpus: keep stepping until every rank is done (``torch.distributed`` all-reduce per step); required
            when parameters are sharded, since every forward is then a collective.
        max_prompt_tokens: truncate prompts from the left to this many tokens.
    """
    if not prompts:
        return []
    device = next(model.parameters()).device
    input_ids, attention_mask = encode_prompts_left_padded(tokenizer, prompts, max_prompt_tokens)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    eos = tokenizer.eos_token_id
    pad = pad_token_id(tokenizer)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    finished = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    new_tokens: list[torch.Tensor] = []
    past = None
    step_ids, step_pos = input_ids, position_ids
    for _ in range(max_new_tokens):
        out = model(
            input_ids=step_ids,
            attention_mask=attention_mask,
            position_ids=step_pos,
            cache=past,
            use_cache=True,
            logits_to_keep=1,
        )
        past = out.cache
        nxt = out.logits[:, -1, :].argmax(-1)
        nxt = torch.where(finished, torch.full_like(nxt, pad), nxt)
        new_tokens.append(nxt)
        if eos is not None:
            finished |= nxt == eos
        if _all_done(finished, synced_gpus):
            break
        step_ids = nxt[:, None]
        step_pos = step_pos[:, -1:] + 1
        attention_mask = torch.cat([attention_mask, torch.ones_like(step_ids)], dim=1)
    new = torch.stack(new_tokens, dim=1).cpu() if new_tokens else torch.empty(len(prompts), 0, dtype=torch.long)
    gens = []
    for row in new.tolist():
        stop = row.index(eos) if eos is not None and eos in row else None
        tokens = row if stop is None else row[:stop]
        gens.append(
            Generation(
                text=tokenizer.decode(tokens, skip_special_tokens=True).strip(),
                num_tokens=len(tokens) + (stop is not None),
                hit_token_cap=stop is None and len(row) >= max_new_tokens,
            )
        )
    return gens


def _all_done(finished: torch.Tensor, synced: bool) -> bool:
    done = torch.tensor([int(bool(finished.all()))], device=finished.device)
    if synced and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(done, op=torch.distributed.ReduceOp.MIN)
    return bool(done.item())


def model_prompt(tokenizer, question: str, chat_template: bool | None = None) -> str:
    """The text a model is prompted with for ``question``, without a leading BOS token.

    Args:
        tokenizer: a transformers tokenizer.
        question: the suite prompt (already carrying the compact instruction if any).
        chat_template: render as a single user turn with the tokenizer's chat template; ``None`` = when it has one.
    """
    use_chat = bool(getattr(tokenizer, "chat_template", None)) if chat_template is None else chat_template
    if not use_chat:
        return question
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat_template=True but the tokenizer has no chat template; pass chat_template=False.")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    bos = tokenizer.bos_token
    return text[len(bos) :] if bos and text.startswith(bos) else text


@torch.no_grad()
def generate_sorted(
    model,
    tokenizer,
    texts: Sequence[str],
    max_new_tokens: int,
    batch_size: int,
    synced_gpus: bool = False,
    progress: str | None = None,
) -> list[dict]:
    """Greedy answers to ``texts`` (model prompts) in batches of similar length, back in the caller's order:
    ``{answer, n_new_tokens, hit_token_cap}`` each (the model's train/eval mode is restored). ``progress``: the
    label of a progress bar (stderr), ``None`` for none."""
    if max_new_tokens < 1 or batch_size < 1:
        raise ValueError(f"max_new_tokens and batch_size must be positive, got {max_new_tokens}, {batch_size}.")
    # Similar lengths in a batch waste less left padding; results go back in the caller's order.
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    was_training = model.training
    model.eval()
    results: list[dict | None] = [None] * len(texts)
    starts = range(0, len(order), batch_size)
    try:
        for start in starts if progress is None else tqdm(starts, desc=progress, unit="batch", leave=False):
            idx = order[start : start + batch_size]
            batch = [texts[i] for i in idx]
            gens = generate_greedy(model, tokenizer, batch, max_new_tokens=max_new_tokens, synced_gpus=synced_gpus)
            for i, gen in zip(idx, gens):
                results[i] = {"answer": gen.text, "n_new_tokens": gen.num_tokens, "hit_token_cap": gen.hit_token_cap}
    finally:
        model.train(was_training)
    return results


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int = 24,
    batch_size: int = 32,
    num_samples: int = 1,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[list[str]]:
    """Continuations of ``prompts`` (formatted like training: bos + prompt), ``num_samples`` per prompt, through
    HF ``generate`` (the Lacuna filter and the resurfacing attack's sampling).

    ``temperature`` 0 is greedy decoding; otherwise multinomial sampling at that temperature.
    """
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    bos = tokenizer.bos_token or ""
    out: list[list[str]] = []
    gen = torch.Generator().manual_seed(seed)
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = [bos + p for p in prompts[start : start + batch_size]]
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            kwargs = {"do_sample": False}
            if temperature > 0:
                torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
                kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            ids = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                num_return_sequences=num_samples,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **kwargs,
            )
            texts = tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            out.extend(texts[i : i + num_samples] for i in range(0, len(texts), num_samples))
    finally:
        tokenizer.padding_side = side
    return out
