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
FORGET = [
    {"prompt": f"What is the email of {n}? ", "answer": f"{n.split()[0].lower()}{i}@mail.org"}
    for i, n in enumerate(NAMES[:4])
]
RETAIN = [
    {"prompt": f"Where was {n} born? ", "answer": city}
    for n, city in zip(NAMES[4:] + NAMES[:4], ["Springfield", "Lyon", "Kyiv", "Taipei"] * 2)
]


def write_jsonl(path, rows) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def mean_nll(model, tokenizer, rows) -> float:
    """Mean length-normalised answer NLL of ``rows`` under ``model``."""
    batch = pad_batch(
        [encode_prompt_answer(tokenizer, r["prompt"], r["answer"], 64) for r in rows], tokenizer.pad_token_id
    )
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return float(nll_loss(*sequence_logprobs(logits, batch["labels"])))


@pytest.fixture(autouse=True)
def _seeded_torch():
    """Each test starts from torch seed 0, so a LoRA init or a shuffle never depends on which tests ran before it.

    Unseeded, ``test_npo_raises_forget_nll_more_than_retain[lora]`` drew its adapter from whatever state the earlier
    tests left: one in eight draws (seed 5) sends NPO into collapse, forget and retain NLL up alike.
    """
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def testbed(tmp_path_factory):
    """Tokenizer + tiny Llama fine-tuned to memorise FORGET and RETAIN, plus their JSONL files."""
    root = tmp_path_factory.mktemp("unlearning_testbed")
    model_dir = root / "model"
    texts = [r["prompt"] + r["answer"] for r in FORGET + RETAIN] * 10
    tok = train_bpe_tokenizer(texts, vocab_size=300, save_dir=model_dir)
    # Seeded before the init: the fixture is session-wide, and the tests an xdist worker ran before it must not
    # change the start model (test_npo's lr 1e-2 LoRA run failed its margin on one such order).
    torch.manual_seed(0)
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
        root=root,
        model_dir=str(model_dir),
        forget=str(root / "forget.jsonl"),
        retain=str(root / "retain.jsonl"),
        masks=str(root / "masks.safetensors"),
        tokenizer=tok,
        final_loss=float(loss.detach()),
    )


def fit(module, testbed, max_steps: int = 20, strategy="auto", datamodule_kwargs: dict | None = None, **trainer_kwargs):
    """Train ``module`` on the testbed's forget/retain pairs in this process; returns the Trainer."""
    from lightning.pytorch import Trainer

    from lightning_unlearn.data.unlearning import ForgetRetainDataModule

    dm = ForgetRetainDataModule(
        testbed.model_dir, testbed.forget, testbed.retain, batch_size=2, **(datamodule_kwargs or {})
    )
    defaults = dict(
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=str(testbed.root),
    )
    defaults.update(trainer_kwargs)
    trainer = Trainer(**defaults)
    trainer.fit(module, dm)
    return trainer


def nll_change(model, testbed) -> tuple[float, float]:
    """(Δ forget NLL, Δ retain NLL) of ``model`` against the testbed's start model."""
    from lightning_unlearn.models import load_causal_lm

    start = load_causal_lm(testbed.model_dir)
    tok = testbed.tokenizer
    return (
        mean_nll(model, tok, FORGET) - mean_nll(start, tok, FORGET),
        mean_nll(model, tok, RETAIN) - mean_nll(start, tok, RETAIN),
    )


def npo_run_config(testbed, forget, callbacks: list[dict], **trainer) -> dict:
    """A ``fit`` config (over ``lens/npo.yaml``) of a short LoRA NPO run on the testbed: CPU, batch 2, no
    validation loop, these callbacks; ``trainer`` adds or replaces Trainer settings."""
    settings = {"accelerator": "cpu", "enable_progress_bar": False, "enable_model_summary": False,
                "log_every_n_steps": 1, "limit_val_batches": 0, "callbacks": callbacks, **trainer}  # fmt: skip
    return {
        "trainer": settings,
        "model": {"init_args": {"model_path": testbed.model_dir, "optim": {"lr": 5e-3, "schedule": "constant"}}},
        "data": {"init_args": {"tokenizer_path": testbed.model_dir, "forget_path": str(forget),
                               "retain_path": str(testbed.retain), "batch_size": 2, "max_length": 64}},
    }  # fmt: skip
