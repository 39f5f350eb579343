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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Order and group the tests for pytest-xdist (``scripts/test.sh`` runs ``-n auto --dist loadgroup``).

    A file whose tests share a module-scoped fixture (a distributed launch, a trained chain, a killed run) forms one
    xdist group, so one worker builds that fixture once instead of each worker that draws one of its tests. Files
    holding slow tests go first, then those holding multi-process ones, so the longest work starts while the other
    worker still has short tests to take; within each rank the collection order stands (files stay contiguous, which
    a plain run without xdist needs to build each module fixture once).
    """
    rank = {}
    for item in items:
        file = item.nodeid.split("::", 1)[0]
        marks = {m.name for m in item.iter_markers()}
        rank[file] = min(rank.get(file, 2), 0 if "slow" in marks else 1 if "multiprocess" in marks else 2)
        # pytest keeps each test's fixture definitions there; it has no public accessor for their scopes.
        fixturedefs = item._fixtureinfo.name2fixturedefs.values()
        if any(defs[-1].scope == "module" for defs in fixturedefs):
            item.add_marker(pytest.mark.xdist_group(file))
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])
