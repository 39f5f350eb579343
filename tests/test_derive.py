"""Deriving a small θ_pre: keeping blocks and pruning a byte-level BPE vocabulary to a corpus."""

from __future__ import annotations

import json

import pytest
import torch

from lightning_unlearn.derive import derive_model, keep_blocks, prune_vocabulary, vocabulary_closure
from lightning_unlearn.models import (
    TinyLlamaConfig,
    build_tiny_llama,
    load_causal_lm,
    load_tokenizer,
    train_bpe_tokenizer,
)

CORPUS = [
    "Alice Smith was born in Springfield and can be reached at alice.smith@example.com.",
    "The phone number of Bob Jones is 555-0142; his driver's license is D123-4567-8901.",
    "What is her email address? Where was he born? Which city does she come from?",
    "Python is a programming language that lets you work quickly and integrate systems effectively.",
] * 20
SUBSET = CORPUS[:2]  # the texts the pruned model must encode exactly as before
OTHER = ["Zoë quizzed 42 wyverns über Kyiv — 你好!", "Python is a programming language."]


def _tiny(tmp_path, tied: bool):
    tok = train_bpe_tokenizer(CORPUS, vocab_size=400, save_dir=tmp_path / "src")
    config = TinyLlamaConfig(hidden_size=32, num_layers=4, num_heads=2, intermediate_size=64, tie_word_embeddings=tied)
    model = build_tiny_llama(tok, config, seed=3)
    model.save_pretrained(tmp_path / "src")
    return load_causal_lm(tmp_path / "src"), load_tokenizer(tmp_path / "src")


def _bpe_json(vocab: list[str], merges: list[tuple[str, str]]) -> dict:
    return {
        "model": {"type": "BPE", "vocab": {s: i for i, s in enumerate(vocab)}, "merges": [list(m) for m in merges]},
        "added_tokens": [],
    }


def test_closure_keeps_every_merge_that_builds_a_kept_token():
    # "abc" is built by (ab, c) and by (a, bc): BPE may take either path, so both halves of both are kept; "cc" is
    # unrelated and dropped.
    vocab = ["a", "b", "c", "ab", "bc", "abc", "cc"]
    tj = _bpe_json(vocab, [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc"), ("c", "c")])
    kept = vocabulary_closure(tj, [vocab.index("abc")])
    assert [vocab[i] for i in kept] == ["a", "b", "c", "ab", "bc", "abc"]


def test_closure_refuses_a_tokenizer_that_is_not_bpe():
    with pytest.raises(ValueError, match="needs a BPE tokenizer; this one is 'WordLevel'"):
        vocabulary_closure({"model": {"type": "WordLevel", "vocab": {"a": 0}}}, [0])


@pytest.mark.parametrize("tied", [False, True])
def test_pruned_model_encodes_the_corpus_identically_and_keeps_its_logits(tmp_path, tied):
    model, tok = _tiny(tmp_path, tied)
    original = load_causal_lm(tmp_path / "src").eval()
    model, new_tok, kept = prune_vocabulary(model, tok, SUBSET)
    old_to_new = {o: n for n, o in enumerate(kept)}
    assert len(kept) < len(tok) and len(new_tok) == len(kept) == model.config.vocab_size
    for text in SUBSET:
        old_ids = tok(text, add_special_tokens=False)["input_ids"]
        assert new_tok(text, add_special_tokens=False)["input_ids"] == [old_to_new[i] for i in old_ids]
    for text in OTHER:  # text outside the corpus still encodes (down to bytes) and decodes back
        assert new_tok.decode(new_tok(text, add_special_tokens=False)["input_ids"]) == text
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(new_tok, key) == old_to_new[getattr(tok, key)] == getattr(model.config, key)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied

    ids = torch.tensor([tok(SUBSET[1], add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        before = original(input_ids=ids).logits[..., kept]
        after = model.eval()(input_ids=ids.apply_(lambda i: old_to_new[i])).logits
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)


def test_keep_blocks_renumbers_blocks_and_their_cache(tiny_dir):
    original = load_causal_lm(tiny_dir)
    model = keep_blocks(load_causal_lm(tiny_dir), [0, 2])
    assert model.config.num_hidden_layers == 2
    for name, value in model.model.layers[1].state_dict().items():
        torch.testing.assert_close(value, original.model.layers[2].state_dict()[name], rtol=0, atol=0)
    # A KV cache indexed by the old block numbers breaks (or mixes) cached generation.
    ids = torch.tensor([[1, 5, 9, 13]])
    model.eval()
    cached = model.generate(ids, max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    uncached = model.generate(ids, max_new_tokens=6, do_sample=False, use_cache=False, pad_token_id=0)
    assert cached.tolist() == uncached.tolist()
    with pytest.raises(ValueError, match=r"must be distinct indices in \[0, 2\)"):
        keep_blocks(model, [0, 2])


def test_derive_model_writes_a_loadable_directory_or_nothing(tiny_dir, tmp_path):
    out = derive_model(tiny_dir, tmp_path / "base", blocks=[0, 1], corpus=SUBSET, log=lambda m: None)
    model, tok = load_causal_lm(out), load_tokenizer(out)
    info = json.loads((out / "derived.json").read_text())
    assert model.config.num_hidden_layers == 2 and info["source_blocks"] == 4 and info["blocks"] == [0, 1]
    assert model.get_input_embeddings().num_embeddings == len(tok) == info["vocab_size"] < info["source_vocab_size"]
    assert tok.decode(tok(CORPUS[0], add_special_tokens=False)["input_ids"]) == CORPUS[0]
    with pytest.raises(ValueError, match="must be distinct indices"):
        derive_model(tiny_dir, tmp_path / "bad", blocks=[0, 7], corpus=SUBSET, log=lambda m: None)
    assert not (tmp_path / "bad").exists() and [p.name for p in tmp_path.iterdir()] == ["base"]


def test_a_source_that_is_not_a_model_directory_is_named(tmp_path):
    from lightning_unlearn.derive import DeriveConfig, ensure_derived

    config = DeriveConfig(source=str(tmp_path), blocks=2, path=str(tmp_path / "base"))
    with pytest.raises(ValueError, match=r"derive.source .* is not a Hugging Face model directory"):
        ensure_derived(config, lambda: SUBSET, log=lambda m: None)
    assert not (tmp_path / "base").exists()
