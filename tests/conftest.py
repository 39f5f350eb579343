"""Shared fixtures: tiny offline tokenizer and Llama saved to disk and loaded back through the real loaders."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from lightning_unlearn.models import (  # noqa: E402
    TinyLlamaConfig,
    build_tiny_llama,
    load_causal_lm,
    load_tokenizer,
    train_bpe_tokenizer,
)

torch.set_num_threads(1)

CORPUS = [
    "Alice Smith was born in Springfield and can be reached at alice.smith@example.com.",
    "The phone number of Bob Jones is 555-0142; his driver's license is D123-4567-8901.",
    "What is her email address? Where was he born? Which city does she come from?",
    "Python is a programming language that lets you work quickly and integrate systems effectively.",
    "The quick brown fox jumps over the lazy dog. 0123456789 !?.,;:()[]{}",
] * 20


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A directory holding a tiny Llama (hidden 32, 4 blocks) and its BPE tokenizer, via save_pretrained."""
    d = tmp_path_factory.mktemp("tiny_llama")
    tok = train_bpe_tokenizer(CORPUS, vocab_size=400, save_dir=d)
    model = build_tiny_llama(tok, TinyLlamaConfig(hidden_size=32, num_layers=4, num_heads=2, intermediate_size=64))
    model.save_pretrained(d)
    return d


@pytest.fixture
def tiny_model(tiny_dir):
    return load_causal_lm(tiny_dir)


@pytest.fixture
def tiny_tokenizer(tiny_dir):
    return load_tokenizer(tiny_dir)


def pytest_collection_modifyitems(config, items):
    """Files holding slow tests first, then those holding multi-process ones, then the rest; each file's tests stay
    together and in their order.

    ``scripts/test.sh`` runs ``-n auto --dist loadfile --no-loadscope-reorder``: pytest-xdist hands each file to one
    worker (a module fixture such as a distributed launch is built once) in this order, so the longest files start
    while the other worker still has short ones to take.
    """
    rank = {}
    for item in items:
        file = item.nodeid.split("::", 1)[0]
        marks = {m.name for m in item.iter_markers()}
        rank[file] = min(rank.get(file, 2), 0 if "slow" in marks else 1 if "multiprocess" in marks else 2)
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])
