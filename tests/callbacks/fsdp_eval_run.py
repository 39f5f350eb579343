"""Evaluate one checkpoint with the evaluation callbacks under ``trainer.validate``; one rank per launch.

Launched by ``test_distributed_agreement.py`` with ``LOCAL_RANK=0/1`` and ``WORLD_SIZE=2`` (FSDP2 via
``ModelParallelStrategy``, gloo), or in-process with one device for the reference. Usage::

    python fsdp_eval_run.py SPEC.json [SPEC.json ...]

SPEC: ``{"lora_dir", "unl_dir", "pre_dir", "inj_dir", "masks", "out", "devices"}``; with ``"mode": "fit"`` the ranks
instead train the LoRA module for 4 steps with a checkpoint every 2, evaluating at each save; with ``"mode":
"ddp"`` they evaluate the TOFU and MIA families under DDP instead of FSDP2. Several SPECs run one after the other in
the same processes (one launch, one process group).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import warnings

import torch

torch.set_num_threads(1)
warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from callback_fixtures import PROMPTS, StubLabeler, TinyCausalLM, mc_items, qa_loader, qa_records  # noqa: E402
from lightning.pytorch import Trainer  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy  # noqa: E402

from lightning_unlearn.callbacks import (  # noqa: E402
    MaskAUCEvaluation,
    MemorizationEvaluation,
    MIAEvaluation,
    RetainDriftEvaluation,
    SCEEvaluation,
    TOFUEvaluation,
    UtilityEvaluation,
)

PERTURBED = ["The quick brown fox.", "Python is a snake.", "Bob Jones was born in Springfield."]


def _trainer(devices: int, callbacks: list, ddp: bool = False, **kwargs) -> Trainer:
    if devices == 1:
        strategy = "auto"
    elif ddp:
        strategy = DDPStrategy(process_group_backend="gloo")
    else:
        strategy = ModelParallelStrategy(
            data_parallel_size=devices, tensor_parallel_size=1, process_group_backend="gloo"
        )
    return Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def _field_families(spec: dict, out: str) -> list:
    """The field's families (TOFU, MIA); θ_inj stands in for a reference model (any save_pretrained model with the
    tokenizer)."""
    tofu = [
        {**r, "paraphrased_answer": r["answer"].lower(), "perturbed_answer": PERTURBED[i % 3 :] + PERTURBED[: i % 3]}
        for i, r in enumerate(qa_records())
    ]
    return [
        TOFUEvaluation(
            {"forget": tofu[:2], "retain": tofu[2:]},
            reference_model=spec["inj_dir"],
            max_new_tokens=6,
            batch_size=3,
            output_dir=out,
        ),
        MIAEvaluation(
            qa_records()[:2],
            qa_records()[2:],
            attacks=("loss", "zlib", "min_k", "min_k_plus_plus", "reference"),
            reference_model=spec["inj_dir"],
            batch_size=1,
            output_dir=out,
        ),
    ]


def ddp(spec: dict) -> None:
    out, devices = spec["out"], int(spec["devices"])
    lora = TinyCausalLM(spec["lora_dir"], lora=True, lora_init_scale=0.3)
    trainer = _trainer(devices, _field_families(spec, out), ddp=True, enable_checkpointing=False)
    trainer.validate(lora, qa_loader(lora.tokenizer))


def run(spec: dict) -> None:
    out, devices = spec["out"], int(spec["devices"])
    lora = TinyCausalLM(spec["lora_dir"], lora=True, lora_init_scale=0.3)
    generation_callbacks = [
        # batch_size 3 over 6 prompts: two ranks get one batch each; uneven splits are covered by memorization.
        SCEEvaluation(PROMPTS, StubLabeler(), max_new_tokens=8, batch_size=3, output_dir=out),
        RetainDriftEvaluation(qa_records(), batch_size=1, output_dir=out),
        MemorizationEvaluation(
            {"forget": qa_records()[:3], "retain": qa_records()[3:]}, max_new_tokens=6, batch_size=2, output_dir=out
        ),
        UtilityEvaluation(mc_items(), batch_size=2, output_dir=out),
        *_field_families(spec, out),
    ]
    _trainer(devices, generation_callbacks, enable_checkpointing=False).validate(lora, qa_loader(lora.tokenizer))
    full = TinyCausalLM(spec["unl_dir"])
    auc = MaskAUCEvaluation(spec["pre_dir"], spec["inj_dir"], spec["masks"], max_samples=2000, output_dir=out)
    _trainer(devices, [auc], enable_checkpointing=False).validate(full, qa_loader(full.tokenizer))


def fit(spec: dict) -> None:
    out, devices = spec["out"], int(spec["devices"])
    module = TinyCausalLM(spec["lora_dir"], lora=True, lr=1.0)
    callbacks = [
        ModelCheckpoint(dirpath=os.path.join(out, "ckpt"), filename="{step}", every_n_train_steps=2, save_top_k=-1),
        SCEEvaluation(PROMPTS, StubLabeler(), max_new_tokens=6, batch_size=4, output_dir=out),
        RetainDriftEvaluation(qa_records(), batch_size=3, output_dir=out),
    ]
    trainer = _trainer(devices, callbacks, max_steps=4, limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(module, qa_loader(module.tokenizer))


if __name__ == "__main__":
    # Nothing is collected after the run: the last garbage collection at exit skips the import graph (1-2 s of CPU).
    atexit.register(gc.freeze)
    for path in sys.argv[1:]:
        spec = json.loads(open(path).read())
        {"fit": fit, "ddp": ddp}.get(spec.get("mode"), run)(spec)
