"""A tiny unlearning testbed: a tiny Llama that has memorised a few forget and retain pairs, saved to disk."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from lightning_unlearn.data.collate import encode_prompt_answer, pad_batch
from lightning_unlearn.losses import nll_loss, sequence_logprobs
from lightning_unlearn.masks import sample_masks, save_masks
from lightning_unlearn.models import TinyLlamaConfig, build_tiny_llama, train_bpe_tokenizer

NAMES = ["Alice Smith", "Bob Jones", "Carol White", "Dan Brown", "Eve Black", "Frank Green", "Gina Gray", "Hal Stone"]
FORGET = [{"prompt": f"What is the email of {n}? ", "answer": f"{n.split()[0].lower()}{i}@mail.org"}
          for i, n in enumerate(NAMES[:4])]
RETAIN = [{"prompt": f"Where was {n} born? ", "answer": city}
          for n, city in zip(NAMES[4:] + NAMES[:4], ["Springfield", "Lyon", "Kyiv", "Taipei"] * 2)]


def write_jsonl(path, rows) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def mean_nll(model, tokenizer, rows) -> float:
    """Mean length-normalised answer NLL of ``rows`` under ``model``."""
    batch = pad_batch([encode_prompt_answer(tokenizer, r["prompt"], r["answer"], 64) for r in rows],
                      tokenizer.pad_token_id)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return float(nll_loss(*sequence_logprobs(logits, batch["labels"])))


@pytest.fixture(scope="session")
def testbed(tmp_path_factory):
    """Tokenizer + tiny Llama fine-tuned to memorise FORGET and RETAIN, plus their JSONL files."""
    root = tmp_path_factory.mktemp("unlearning_testbed")
    model_dir = root / "model"
    texts = [r["prompt"] + r["answer"] for r in FORGET + RETAIN] * 10
    tok = train_bpe_tokenizer(texts, vocab_size=300, save_dir=model_dir)
    model = build_tiny_llama(tok, TinyLlamaConfig(hidden_size=32, num_layers=4, num_heads=2, intermediate_size=64))
    rows = [encode_prompt_answer(tok, r["prompt"], r["answer"], 64) for r in FORGET + RETAIN]
    batch = pad_batch(rows, tok.pad_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    model.train()
    for _ in range(80):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = nll_loss(*sequence_logprobs(logits, batch["labels"]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(model_dir)
    # Ground-truth group masks for OracleGrad: 6 groups of 10% of θ_mask (blocks 0-1 of the 4).
    save_masks(root / "masks.safetensors", sample_masks(model, num_groups=6, coverage=0.1, seed=0))
    write_jsonl(root / "forget.jsonl", FORGET)
    write_jsonl(root / "retain.jsonl", RETAIN)
    return SimpleNamespace(
        root=root, model_dir=str(model_dir), forget=str(root / "forget.jsonl"), retain=str(root / "retain.jsonl"),
        masks=str(root / "masks.safetensors"), tokenizer=tok, final_loss=float(loss.detach()),
    )
