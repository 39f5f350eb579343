"""Batched generation through HF ``generate`` (greedy with left padding, or sampled), and the one rendering of a
question as a model prompt; used by every generation-based metric and workflow."""

from __future__ import annotations

import copy
import functools
import inspect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.models import lora_adapter_blocks, unwrap_peft


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
        raise ConfigError(
            "the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token before generating."
        )
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
    return [_generation(tokenizer, row, eos, max_new_tokens) for row in out[:, input_ids.shape[1] :].cpu().tolist()]


@torch.no_grad()
def generate_greedy_adapters(
    model,
    tokenizer,
    prompts: Sequence[str],
    adapters: Sequence[str],
    max_new_tokens: int = 64,
    max_prompt_tokens: int | None = None,
    prefixes: PrefixStore | None = None,
) -> dict[str, list[Generation]]:
    """Greedy answers to one batch of ``prompts`` by each of several LoRA adapters loaded into ``model``, in one
    decoding loop: the batch holds the prompts once per adapter (:func:`~lightning_unlearn.models.lora_adapter_blocks`),
    so every decoding step reads the base weights once for all adapters, and a prompt leaves the batch and the KV cache
    once every adapter's answer to it has ended (:func:`greedy_blocks`). ``{adapter: answers}``, the same text as
    :func:`generate_greedy` with each adapter active alone. One process, eval mode. ``prefixes``: the prompts' shared
    leading tokens' keys and values kept from earlier batches of the same pass (:class:`PrefixStore`).
    """
    names = list(adapters)
    if not prompts:
        return {name: [] for name in names}
    if prefixes is not None:
        prefixes.claim(names)
    input_ids, attention_mask = encode_prompts_left_padded(tokenizer, prompts, max_prompt_tokens)
    eos = end_of_sequence_ids(model, tokenizer)
    with lora_adapter_blocks(model, names):
        rows = greedy_blocks(model, input_ids.repeat(len(names), 1), attention_mask.repeat(len(names), 1), eos,
                             pad_token_id(tokenizer), max_new_tokens, blocks=len(names), prefixes=prefixes)  # fmt: skip
    gens = [_generation(tokenizer, row, eos, max_new_tokens) for row in rows]
    n = len(prompts)
    return {name: gens[k * n : (k + 1) * n] for k, name in enumerate(names)}


@torch.no_grad()
def greedy_blocks(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    eos: Sequence[int],
    pad_id: int,
    max_new_tokens: int,
    blocks: int = 1,
    share_prefix: bool = True,
    prefixes: PrefixStore | None = None,
) -> list[list[int]]:
    """Greedy decoding with a KV cache that stops computing a prompt once it has ended: each row's new tokens up
    to and including its first end-of-sequence id (or ``max_new_tokens`` of them).

    The batch is ``blocks`` equal blocks of rows holding the same prompts in the same order (one block per LoRA
    adapter under :func:`~lightning_unlearn.models.lora_adapter_blocks`); prompt i's rows are dropped from the batch
    and from the cache once every block's answer to it has ended, so the blocks stay equal and the finished rows
    cost nothing more. The model's inputs at each step are those of HF ``generate``'s greedy search (left-padded
    ``attention_mask``, position ids counting real tokens, one new token a step, logits of the last position only,
    a row that has ended fed the pad id), so each row gets ``generate``'s tokens.

    With ``share_prefix``, the leading tokens every prompt shares (a chat template's system turn, say) are run once
    per block and their keys and values copied to the block's rows: the cache then holds ``[prefix | padding |
    rest of the prompt]``, the padding masked and the rest positioned after the prefix, so each row attends to the
    same tokens at the same positions as from ``[padding | prompt]``. The cache writes each step's keys and values
    into buffers sized for the whole answer (:func:`_preallocated_cache`) rather than concatenating them. With a
    ``prefixes`` store, the part of the prefix an earlier batch already ran is taken from it and only the rest is
    run (then kept there for the batches after).

    Args:
        model: a transformers (or peft) causal LM in eval mode.
        input_ids: ``(B, T)`` left-padded prompts, ``B`` a multiple of ``blocks``.
        attention_mask: their mask.
        eos: the ids that end a sequence.
        pad_id: fed to a row that has ended while its prompt's other rows decode.
        max_new_tokens: the token cap.
        blocks: the number of equal blocks of rows.
        share_prefix: compute the prompts' common leading tokens once per block.
        prefixes: keys and values of earlier batches' prefixes under the same weights and blocks.
    """
    rows = input_ids.shape[0]
    if rows % blocks:
        raise ConfigError(f"a batch of {rows} rows is not {blocks} equal blocks.")
    n = rows // blocks
    device = next(model.parameters()).device
    ids, mask = input_ids.to(device), attention_mask.to(device)
    position = mask.long().cumsum(-1) - 1
    position.masked_fill_(mask == 0, 1)
    accepted = inspect.signature(unwrap_peft(model).forward).parameters
    kwargs = {"logits_to_keep": 1} if "logits_to_keep" in accepted else {}
    cache_arg = "cache" if "cache" in accepted else "past_key_values"  # transformers 5.x renamed it
    out: list[list[int]] = [[] for _ in range(rows)]
    ended = torch.zeros(rows, dtype=torch.bool)
    live = torch.arange(n)  # the prompts still decoding, in block order
    eos_ids = torch.tensor(list(eos), dtype=torch.long)
    kwargs[cache_arg] = _preallocated_cache(ids.shape[1] + max_new_tokens)
    shared = _shared_prefix(ids, mask) if share_prefix and n > 1 else 0
    if shared:
        prefix = ids[0, -int(mask[0].sum()) :][:shared]
        done = 0
        if prefixes is not None:
            done, kwargs[cache_arg] = prefixes.take(prefix, ids.shape[1] + max_new_tokens)
        if done < shared:  # the prefix's tokens no earlier batch ran, positioned after those it did
            rest = prefix[done:].repeat(blocks, 1)
            attention = torch.ones(blocks, shared, dtype=mask.dtype, device=device)
            output = model(input_ids=rest, attention_mask=attention, use_cache=True, **kwargs)
            kwargs[cache_arg] = output[cache_arg]
            if prefixes is not None:
                prefixes.keep(prefix, kwargs[cache_arg])
        kwargs[cache_arg].batch_repeat_interleave(n)  # block k's one row -> its n rows
        ids, mask, position = _after_prefix(ids, mask, shared, pad_id)
    for step in range(max_new_tokens):
        output = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True, **kwargs)
        kwargs[cache_arg] = cache = output[cache_arg]
        logits = output.logits
        tokens = logits[:, -1].to(dtype=torch.float32).argmax(-1).cpu()
        where = (torch.arange(blocks)[:, None] * n + live[None, :]).reshape(-1)  # batch row -> row of the result
        fresh = ~ended[where]
        for r, t in zip(where[fresh].tolist(), tokens[fresh].tolist()):
            out[r].append(t)
        ended[where] |= torch.isin(tokens, eos_ids)
        if step == max_new_tokens - 1:
            break
        done = ended[where].reshape(blocks, -1).all(0)  # prompts every block has ended
        if done.all():
            break
        tokens = torch.where(ended[where], pad_id, tokens)
        if done.any():
            kept = (~done).nonzero().squeeze(1)
            batch_rows = (torch.arange(blocks)[:, None] * live.numel() + kept[None, :]).reshape(-1)
            cache.batch_select_indices(batch_rows.to(device))
            mask, tokens, live = mask[batch_rows.to(device)], tokens[batch_rows], live[kept]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)
        ids = tokens[:, None].to(device)
        position = mask.long().sum(-1, keepdim=True) - 1
    return out


class PrefixStore:
    """Keys and values of the prompts' shared leading tokens (a chat template's system turn, the start of a
    question template) from earlier batches of one generation pass, so that :func:`greedy_blocks` runs each leading
    token once per block in the whole pass instead of once per batch: a batch takes the longest run of its prefix
    that a kept one starts with (a causal model's keys and values for a token do not depend on what follows it) and
    runs only the rest. Valid while the weights stay as they are: make one per pass (one per checkpoint, or per
    set of adapters; :meth:`claim` refuses a store made for other adapters). Keeps the ``size`` most recently used
    prefixes."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self.adapters: tuple | None = None
        self._kept: OrderedDict[tuple[int, ...], object] = OrderedDict()

    def claim(self, adapters: Sequence) -> None:
        """Bind the store to these adapters (in this order: one block of rows each); refuse any others."""
        adapters = tuple(adapters)
        if self.adapters is None:
            self.adapters = adapters
        elif self.adapters != adapters:
            raise ConfigError(
                f"this PrefixStore holds keys and values computed under adapters {list(self.adapters)}, not "
                f"{list(adapters)}; make one PrefixStore per set of adapters (and per pass: the weights must not "
                "change)."
            )

    def take(self, prefix: torch.Tensor, capacity: int):
        """``(tokens, cache)``: how many of ``prefix``'s leading tokens a kept prefix covers, and a new cache (a row
        a block) holding their keys and values with room for ``capacity`` tokens (an empty one if none)."""
        tokens = tuple(prefix.tolist())
        best, best_key = 0, None
        for key in self._kept:
            common = next((i for i, (a, b) in enumerate(zip(key, tokens)) if a != b), min(len(key), len(tokens)))
            if common > best:
                best, best_key = common, key
        cache = _preallocated_cache(capacity)
        if best_key is None:
            return 0, cache
        self._kept.move_to_end(best_key)
        cache.layers = [layer.copied(best, capacity) for layer in self._kept[best_key].layers]
        return best, cache

    def keep(self, prefix: torch.Tensor, cache) -> None:
        """Keep a copy of ``cache`` (a row a block, holding exactly ``prefix``'s keys and values)."""
        kept = copy.copy(cache)
        kept.layers = [layer.copied(layer.filled, layer.filled) for layer in cache.layers]
        self._kept[tuple(prefix.tolist())] = kept
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)


def _preallocated_cache(length: int):
    """An empty ``DynamicCache`` whose layers write each step's keys and values into buffers sized for ``length``
    tokens instead of concatenating: no new multi-megabyte tensor a layer and a step (on CPU every one of them is
    fresh pages to fault in). The model sees views of the filled part, the same values as the plain cache."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = functools.partial(_preallocated_layer_class(), length)
    return cache


@functools.cache
def _preallocated_layer_class():
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A :class:`~transformers.cache_utils.DynamicLayer` whose ``keys``/``values`` are views of the first
        ``filled`` positions of ``(batch, heads, capacity, head_dim)`` buffers, written in place by ``update``."""

        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity, self.filled = capacity, 0
            self.key_buffer = self.value_buffer = None

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:  # the base class's own first call (its dtype, device and flags)
                super().update(key_states, value_states, *args, **kwargs)
                self.filled = 0
            end = self.filled + key_states.shape[-2]
            room = 0 if self.key_buffer is None else self.key_buffer.shape[-2]
            if end > room:  # at least double an overrun buffer: a cache kept past its length regrows rarely
                self._reallocate(key_states, value_states, max(end, self.capacity, 2 * room))
            self.key_buffer[:, :, self.filled : end] = key_states
            self.value_buffer[:, :, self.filled : end] = value_states
            self.filled = end
            self._view_filled()
            return self.keys, self.values

        def _view_filled(self) -> None:
            self.keys, self.values = self.key_buffer[:, :, : self.filled], self.value_buffer[:, :, : self.filled]

        def _reallocate(self, key_states, value_states, capacity: int) -> None:
            def grown(old, new):
                buffer = new.new_empty(*new.shape[:2], capacity, new.shape[-1])
                if self.filled:
                    buffer[:, :, : self.filled] = old[:, :, : self.filled]
                return buffer

            self.key_buffer = grown(self.key_buffer, key_states)
            self.value_buffer = grown(self.value_buffer, value_states)

        def copied(self, tokens: int, capacity: int) -> PreallocatedLayer:
            """A new layer holding this one's first ``tokens`` keys and values, with room for ``capacity``."""
            layer = copy.copy(self)
            layer.capacity, layer.filled = capacity, tokens
            layer._reallocate(self.key_buffer, self.value_buffer, capacity)  # new buffers holding the first tokens
            layer._view_filled()
            return layer

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.filled:
                self.key_buffer = self.key_buffer.repeat_interleave(repeats, dim=0)
                self.value_buffer = self.value_buffer.repeat_interleave(repeats, dim=0)
                self._view_filled()

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.filled:
                self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
                self._view_filled()

    return PreallocatedLayer


def _shared_prefix(ids: torch.Tensor, mask: torch.Tensor) -> int:
    """How many leading tokens all left-padded rows share, leaving every row at least one token of its own."""
    lengths = mask.sum(-1)
    shortest = int(lengths.min())
    if shortest < 2:
        return 0
    start = ids.shape[1] - lengths
    aligned = ids.gather(1, start[:, None] + torch.arange(shortest - 1, device=ids.device))  # each row's first tokens
    return int((aligned == aligned[:1]).all(0).long().cumprod(0).sum())


def _after_prefix(
    ids: torch.Tensor, mask: torch.Tensor, shared: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompts' tokens after their ``shared`` first ones, left-padded, the attention mask over ``[prefix |
    those]`` and their positions (counting real tokens, as ``generate`` does; 1 on padding)."""
    rest = mask.sum(-1) - shared
    width = int(rest.max())
    own = torch.arange(width, device=ids.device)[None, :] >= (width - rest)[:, None]
    rest_ids = torch.where(own, ids[:, -width:], pad_id)
    position = own.long().cumsum(-1) - 1 + shared
    position.masked_fill_(~own, 1)
    full = torch.cat([mask.new_ones(mask.shape[0], shared), own.to(mask.dtype)], dim=-1)
    return rest_ids, full, position


def _generation(tokenizer, row: Sequence[int], eos: Sequence[int], max_new_tokens: int) -> Generation:
    """A row of new tokens as a :class:`Generation` (cut at its first end-of-sequence id)."""
    stop = next((i for i, t in enumerate(row) if t in eos), None)
    tokens = row if stop is None else row[:stop]
    return Generation(
        text=tokenizer.decode(tokens, skip_special_tokens=True).strip(),
        num_tokens=len(tokens) + (stop is not None),
        hit_token_cap=stop is None and len(row) >= max_new_tokens,
    )


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
        raise ConfigError("chat_template=True but the tokenizer has no chat template; pass chat_template=False.")
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
    prefixes: PrefixStore | None = None,
) -> list[dict] | dict[str, list[dict]]:
    """Greedy answers to ``texts`` (model prompts) in batches of similar length, back in the caller's order:
    ``{answer, n_new_tokens, hit_token_cap}`` each (the model's train/eval mode is restored). ``progress``: the
    label of a progress bar (stderr), ``None`` for none.

    ``adapters``: names of LoRA adapters loaded into ``model``; then every batch holds its ``batch_size`` prompts
    once per adapter (:func:`generate_greedy_adapters`), so one ``generate`` answers them for all adapters and the
    base weights are read once per token for all of them; the result is ``{adapter: answers}``, the same text as
    with each adapter active alone (greedy). The batches share one :class:`PrefixStore` (``prefixes``, or a new one),
    so the prompts' common leading tokens run once for the whole call.
    """
    if max_new_tokens < 1 or batch_size < 1:
        raise ConfigError(f"max_new_tokens and batch_size must be positive, got {max_new_tokens}, {batch_size}.")
    names = list(adapters) if adapters is not None else [None]
    if adapters is not None and not names:
        raise ConfigError("adapters is empty; name at least one loaded peft adapter.")
    # Similar lengths in a batch waste less left padding; results go back in the caller's order.
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    was_training = model.training
    model.eval()
    results: dict = {name: [None] * len(texts) for name in names}
    starts = range(0, len(order), batch_size)
    prefixes = PrefixStore() if prefixes is None else prefixes
    try:
        for start in starts if progress is None else tqdm(starts, desc=progress, unit="batch", leave=False):
            idx = order[start : start + batch_size]
            batch = [texts[i] for i in idx]
            if adapters is None:
                gens = {None: generate_greedy(model, tokenizer, batch, max_new_tokens, synced_gpus)}
            else:
                gens = generate_greedy_adapters(model, tokenizer, batch, names, max_new_tokens, prefixes=prefixes)
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
