"""The evaluation callbacks on a real unlearning objective (NPO with a LoRA adapter)."""

from __future__ import annotations

import json

from callback_fixtures import StubLabeler, qa_records
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_unlearn.callbacks import CheckpointSelection, RetainDriftEvaluation, SCEEvaluation
from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows
from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives import NPO
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig


def test_npo_lora_run_is_evaluated_at_every_checkpoint(tiny_dir, tmp_path):
    forget, retain = tmp_path / "forget.jsonl", tmp_path / "retain.jsonl"
    records = qa_records()
    forget.write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    retain.write_text("".join(json.dumps(r) + "\n" for r in records[2:]))
    module = NPO(
        str(tiny_dir), adapter=AdapterConfig(kind="lora", r=4, alpha=8, dropout=0.0), optim=OptimizerConfig(lr=5e-2)
    )
    data = ForgetRetainDataModule(str(tiny_dir), str(forget), str(retain), batch_size=1)
    out = tmp_path / "eval"
    callbacks = [
        ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=2, save_top_k=-1),
        SCEEvaluation(
            narrative="demo-canal-tolls",
            levels=["L0", "L1", "L2"],
            labeler=StubLabeler(),
            max_new_tokens=6,
            output_dir=str(out),
        ),
        RetainDriftEvaluation(str(retain), output_dir=str(out)),
        CheckpointSelection(output_dir=str(out)),
    ]
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=4,
        logger=False,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=data)
    rows = read_rows(out / "checkpoint_metrics.jsonl")
    assert sorted((r["step"], r["family"]) for r in rows) == [
        (2, "retain_drift"),
        (2, "sce"),
        (4, "retain_drift"),
        (4, "sce"),
    ]
    drift = [r for r in rows if r["family"] == "retain_drift"]
    assert drift[-1]["kl"] > 0  # base = the same network with the adapter disabled
    assert json.loads((out / "selection.json").read_text())["num_checkpoints"] == 2
    assert (tmp_path / "ckpt" / "adapter-step=4").is_dir()  # the objective's own checkpoint hook still ran
