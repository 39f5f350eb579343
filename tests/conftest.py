"""Shared fixtures: tiny offline tokenizer and Llama, and a tiny sentence-embedding judge, saved to disk and loaded
back through the real loaders."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread per process, subprocesses included (they inherit it): the suite runs one pytest-xdist worker per core, so
# every process shares its core with others, and a two-thread process then waits for its descheduled thread at each
# op (measured: the tiny chain's greedy filter 8.3 s with two threads beside one busy process, 0.25 s with one).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

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


def build_tiny_judge(directory: Path, hidden_size: int = 16) -> Path:
    """A random 2-layer BERT with a WordPiece tokenizer trained on :data:`CORPUS`, written in the sentence-transformers
    layout (modules.json: transformer → mean pooling → normalize), as the responsiveness judge loads any model."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1)
    wordpiece.save_model(str(directory))
    tokenizer = BertTokenizerFast(vocab_file=str(directory / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=256,
    )
    BertModel(config).save_pretrained(directory)
    modules = [("0", "", "Transformer"), ("1", "1_Pooling", "Pooling"), ("2", "2_Normalize", "Normalize")]
    (directory / "modules.json").write_text(json.dumps(
        [{"idx": int(i), "name": i, "path": path, "type": f"sentence_transformers.models.{kind}"}
         for i, path, kind in modules]))  # fmt: skip
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": hidden_size, "pooling_mode_mean_tokens": True}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (directory / "2_Normalize").mkdir(exist_ok=True)
    return directory


@pytest.fixture(scope="session", autouse=True)
def tiny_judge_dir(tmp_path_factory):
    """A tiny judge, and ``$LIGHTNING_UNLEARN_JUDGE`` pointing at it for the whole session: every judge built with
    the default model (shipped configs, commands) embeds with it, not with the 90 MB all-MiniLM-L6-v2 (tests that
    need the real model unset the variable)."""
    directory = build_tiny_judge(tmp_path_factory.mktemp("tiny_judge"))
    os.environ["LIGHTNING_UNLEARN_JUDGE"] = str(directory)
    return directory


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
