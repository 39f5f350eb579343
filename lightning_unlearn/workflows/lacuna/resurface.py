"""The resurfacing attack (Lacuna Sec. 4.3): instruction-tune a (unlearned) model on the held-out relearning split,
then count forget profiles whose PII appears in at least one of K sampled generations: ``lightning-unlearn lacuna
resurface``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

from lightning_unlearn.atomic import write_text_atomically
from lightning_unlearn.data.templates import TARGET_FIELDS
from lightning_unlearn.generation import generate
from lightning_unlearn.metrics.memorization import extracted
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig

Field = Literal[TARGET_FIELDS]


def leaked_profiles(model, tokenizer, forget, k: int, temperature: float, max_new_tokens: int, seed: int) -> list[int]:
    """Profile ids of ``forget`` rows whose PII value appears in at least one of ``k`` sampled continuations of
    their prompt (:func:`~lightning_unlearn.metrics.memorization.extracted`, the filter's definition)."""
    samples = generate(model, tokenizer, list(forget["prompt"]), max_new_tokens, batch_size=8, num_samples=k,
                       temperature=temperature, seed=seed)  # fmt: skip
    leaked = set()
    for pid, answer, outs in zip(forget["profile_id"], forget["answer"], samples, strict=True):
        if any(extracted(outs, [answer] * len(outs))):
            leaked.add(int(pid))
    return sorted(leaked)


def resurface(
    model_dir: str,
    splits_dir: str,
    field: str,
    out_dir: str,
    k: int = 200,
    max_epochs: int = 10,
    lr: float = 2e-3,
    temperature: float = 1.0,
    max_new_tokens: int = 24,
    seed: int = 0,
) -> dict:
    """The resurfacing attack (Lacuna Sec. 4.3): relearn on the held-out split, count leaking forget profiles.

    Relearning is the instruction tuning procedure (``InstructionModule``: LoRA on the last two blocks, lr
    ``lr``) on every row of ``<splits_dir>/relearn`` for ``max_epochs`` epochs. A forget profile leaks when its
    ``field`` value appears in at least one of ``k`` sampled generations for its forget prompt (Lacuna: K = 200);
    the same count on the model before relearning is reported beside it (``leaked_profiles_unlearned``). Seeded:
    the same arguments give the same report.
    """
    from datasets import load_from_disk
    from lightning.pytorch import Trainer, seed_everything

    from lightning_unlearn.data.instruction_datamodule import InstructionDataModule
    from lightning_unlearn.models import load_causal_lm, load_tokenizer
    from lightning_unlearn.objectives.instruction import InstructionModule

    forget_path = Path(splits_dir) / field / "forget"
    relearn_path = Path(splits_dir) / "relearn"
    for p in (forget_path, relearn_path):
        if not p.exists():
            raise FileNotFoundError(f"split {str(p)!r} does not exist; run `lightning-unlearn lacuna filter` first.")
    forget = load_from_disk(str(forget_path))
    if len(forget) == 0:
        raise ValueError(f"forget split {str(forget_path)!r} is empty: nothing can leak.")
    if len(load_from_disk(str(relearn_path))) == 0:
        raise ValueError(f"relearning split {str(relearn_path)!r} is empty: the testbed memorized no relearn profile.")
    sampling = dict(k=k, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    before = leaked_profiles(model, tokenizer, forget, **sampling)
    del model
    seed_everything(seed, verbose=False)
    relearned = Path(out_dir) / "relearned"
    shutil.rmtree(relearned, ignore_errors=True)
    module = InstructionModule(model_path=model_dir, optim=OptimizerConfig(lr=lr))
    data = InstructionDataModule(source=str(relearn_path), val_fraction=0.0, seed=seed)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=max_epochs,
        default_root_dir=str(relearned),
        enable_checkpointing=False,
        enable_progress_bar=False,
        logger=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, data)
    model_path = relearned / "export" / "model"
    model, tokenizer = load_causal_lm(model_path), load_tokenizer(model_path)
    leaked = leaked_profiles(model, tokenizer, forget, **sampling)
    shutil.rmtree(relearned / "export", ignore_errors=True)  # a full model per attack; the counts are the result
    n = len(forget)
    report = {
        "model": str(model_dir),
        "field": field,
        "k": k,
        "relearn_epochs": max_epochs,
        "seed": seed,
        "forget_profiles": n,
        "leaked_profiles_unlearned": len(before),
        "leak_rate_unlearned": len(before) / n,
        "leaked_profiles": len(leaked),
        "leak_rate": len(leaked) / n,
        "leaked_profile_ids_unlearned": before,
        "leaked_profile_ids": leaked,
    }
    write_text_atomically(Path(out_dir, "resurfacing.json"), json.dumps(report, indent=1))
    return report


def resurface_command(
    *,
    model: str,
    out: str,
    splits: str = "runs/lacuna/splits",
    field: Field = "email",
    k: int = 200,
    epochs: int = 10,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict:
    """Resurfacing attack: relearn on held-out PII, then count the forget profiles that leak.

    A forget profile leaks when its ``field`` value appears in at least one of ``k`` sampled generations; the
    count before relearning is reported beside it.

    Args:
        model: the (unlearned) model directory to attack.
        out: where the relearned model and ``resurfacing.json`` go.
        splits: the memorization-filtered splits (``lacuna filter``).
        field: the PII field attacked.
        k: sampled generations per forget prompt (Lacuna: 200).
        epochs: relearning epochs.
        temperature: sampling temperature.
        seed: seed of the relearning and of the sampling.
    """
    report = resurface(model, splits, field, out, k, epochs, temperature=temperature, seed=seed)
    return {key: value for key, value in report.items() if not key.startswith("leaked_profile_ids")}


__all__ = ["leaked_profiles", "resurface", "resurface_command"]
