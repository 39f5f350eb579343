"""Batched generation through HF ``generate`` (greedy with left padding, or sampled), and the one rendering of a
question as a model prompt; used by every generation-based metric and workflow."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from lightning_unlearn.models import lora_adapter_blocks


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
    """Greedy answers for one batch of prompts through HF ``generate`` (left-padded, KV cache).

    Decoding is plain greedy whatever the model's ``generation_config`` holds (no repetition penalty or sampling
    defaults leak in); it stops at any of the model's end-of-sequence ids (``generation_config.eos_token_id`` may
    be a list) and the tokenizer's. Under FSDP2 the model's ``generate`` is registered as a forward method
    (``register_fsdp_forward_method``), so the root parameters are gathered for it as for ``forward``, peft-wrapped
    or not. Position ids count real tokens only, so a left-padded prompt is encoded exactly as it is alone.

    Args:
        model: a transformers (or peft) causal LM.
        tokenizer: its tokenizer.
        prompts: the batch (the caller chooses the batch size).
        max_new_tokens: the token cap.
        synced_gpus: keep stepping until every rank is done; required when parameters are sharded, since every
            forward is then a collective.
        max_prompt_tokens: truncate prompts from the left to this many tokens.
    """
    from transformers import GenerationConfig

    if not prompts:
        return []
    device = next(model.parameters()).device
    input_ids, attention_mask = encode_prompts_left_padded(tokenizer, prompts, max_prompt_tokens)
    eos = end_of_sequence_ids(model, tokenizer)
    config = GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos or None, pad_token_id=pad_token_id(tokenizer)
    )
    _register_fsdp_generate(model)
    out = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        generation_config=config,
        synced_gpus=synced_gpus,
    )
    gens = []
    for row in out[:, input_ids.shape[1] :].cpu().tolist():
        stop = next((i for i, t in enumerate(row) if t in eos), None)
        tokens = row if stop is None else row[:stop]
        gens.append(
            Generation(
                text=tokenizer.decode(tokens, skip_special_tokens=True).strip(),
                num_tokens=len(tokens) + (stop is not None),
                hit_token_cap=stop is None and len(row) >= max_new_tokens,
            )
        )
    return gens


@torch.no_grad()
def generate_greedy_adapters(
    model,
    tokenizer,
    prompts: Sequence[str],
    adapters: Sequence[str],
    max_new_tokens: int = 64,
    max_prompt_tokens: int | None = None,
) -> dict[str, list[Generation]]:
    """Greedy answers to one batch of ``prompts`` by each of several LoRA adapters loaded into ``model``, from one
    ``generate``: the batch holds the prompts once per adapter (:func:`~lightning_unlearn.models.lora_adapter_blocks`),
    so every decoding step reads the base weights once for all adapters. ``{adapter: answers}``, the same text as
    :func:`generate_greedy` with each adapter active alone. One process, eval mode.
    """
    names = list(adapters)
    with lora_adapter_blocks(model, names):
        gens = generate_greedy(model, tokenizer, list(prompts) * len(names), max_new_tokens, False, max_prompt_tokens)
    n = len(prompts)
    return {name: gens[k * n : (k + 1) * n] for k, name in enumerate(names)}


def end_of_sequence_ids(model, tokenizer) -> list[int]:
    """Every id that ends a sequence: the model's ``generation_config.eos_token_id`` (an int or a list) and the
    tokenizer's ``eos_token_id``."""
    config = getattr(model, "generation_config", None)
    ids = getattr(config, "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return [int(i) for i in ids]


def _register_fsdp_generate(model) -> None:
    """Under FSDP2, make ``model.generate`` gather the root's parameters like ``forward`` does (once per model)."""
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

    if isinstance(model, FSDPModule) and not getattr(model, "_lightning_unlearn_generate_registered", False):
        register_fsdp_forward_method(model, "generate")
        model._lightning_unlearn_generate_registered = True


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
    adapters: Sequence[str] | None = None,
) -> list[dict] | dict[str, list[dict]]:
    """Greedy answers to ``texts`` (model prompts) in batches of similar length, back in the caller's order:
    ``{answer, n_new_tokens, hit_token_cap}`` each (the model's train/eval mode is restored). ``progress``: the
    label of a progress bar (stderr), ``None`` for none.

    ``adapters``: names of LoRA adapters loaded into ``model``; then every batch holds its ``batch_size`` prompts
    once per adapter (:func:`generate_greedy_adapters`), so one ``generate`` answers them for all adapters and the
    base weights are read once per token for all of them; the result is ``{adapter: answers}``, the same text as
    with each adapter active alone (greedy).
    """
    if max_new_tokens < 1 or batch_size < 1:
        raise ValueError(f"max_new_tokens and batch_size must be positive, got {max_new_tokens}, {batch_size}.")
    names = list(adapters) if adapters is not None else [None]
    if adapters is not None and not names:
        raise ValueError("adapters is empty; name at least one loaded peft adapter.")
    # Similar lengths in a batch waste less left padding; results go back in the caller's order.
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    was_training = model.training
    model.eval()
    results: dict = {name: [None] * len(texts) for name in names}
    starts = range(0, len(order), batch_size)
    try:
        for start in starts if progress is None else tqdm(starts, desc=progress, unit="batch", leave=False):
            idx = order[start : start + batch_size]
            batch = [texts[i] for i in idx]
            if adapters is None:
                gens = {None: generate_greedy(model, tokenizer, batch, max_new_tokens, synced_gpus)}
            else:
                gens = generate_greedy_adapters(model, tokenizer, batch, names, max_new_tokens)
            for name in names:
                for i, gen in zip(idx, gens[name]):
                    results[name][i] = {
                        "answer": gen.text, "n_new_tokens": gen.num_tokens, "hit_token_cap": gen.hit_token_cap
                    }  # fmt: skip
    finally:
        model.train(was_training)
    return results if adapters is not None else results[None]


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
                input_ids=enc["input_ids"],  # not token_type_ids, which some tokenizers add and causal LMs refuse
                attention_mask=enc["attention_mask"],
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
