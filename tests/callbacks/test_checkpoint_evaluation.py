"""Evaluation callbacks during fit: rows per checkpoint, resume without duplicates, TensorBoard, validate."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml
from callback_fixtures import PROMPTS, StubLabeler, TinyCausalLM, mc_items, qa_loader, qa_records
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_unlearn.callbacks import (
    CheckpointSelection,
    MemorizationEvaluation,
    RetainDriftEvaluation,
    SCEEvaluation,
    UtilityEvaluation,
)
from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows

FAMILIES = {"sce", "retain_drift", "memorization", "utility"}


def _callbacks(labeler=None):
    return [
        SCEEvaluation(PROMPTS, labeler or StubLabeler(), max_new_tokens=6, batch_size=4, num_text_samples=3),
        CheckpointSelection(collapse_boundary=0.5),  # listed before the evaluators on purpose: order must not matter
        RetainDriftEvaluation(qa_records(), batch_size=3),
        MemorizationEvaluation({"forget": qa_records()[:2], "retain": qa_records()[2:]}, max_new_tokens=6),
        UtilityEvaluation(mc_items(), batch_size=2),
    ]


def _trainer(root, max_steps, callbacks, ckpt_dir):
    return Trainer(
        default_root_dir=root,
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=TensorBoardLogger(root, name="run", version=0),
        callbacks=[
            ModelCheckpoint(dirpath=ckpt_dir, filename="{step}", every_n_train_steps=2, save_top_k=-1),
            *callbacks,
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )


@pytest.fixture(scope="module")
def resumed_run(tiny_dir, tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("run")
    ckpt = root / "ckpt"
    module = TinyCausalLM(str(tiny_dir), lora=True, lr=1.0)
    # First run "crashes" after the checkpoint at step 6; the resume starts from the step-4 checkpoint, so step 6
    # is evaluated twice and must still appear once.
    _trainer(root, 6, _callbacks(), ckpt).fit(module, qa_loader(module.tokenizer))
    rows_before = read_rows(root / "run" / "version_0" / "checkpoint_metrics.jsonl")
    labeler = StubLabeler()
    module2 = TinyCausalLM(str(tiny_dir), lora=True, lr=1.0)
    _trainer(root, 10, _callbacks(labeler), ckpt).fit(
        module2, qa_loader(module2.tokenizer), ckpt_path=str(ckpt / "step=4.ckpt")
    )
    return root, rows_before, labeler


def test_every_checkpoint_once_after_resume(resumed_run):
    root, rows_before, labeler = resumed_run
    assert sorted({(r["step"], r["family"]) for r in rows_before}) == sorted(
        (s, f) for s in (2, 4, 6) for f in FAMILIES
    )
    rows = read_rows(root / "run" / "version_0" / "checkpoint_metrics.jsonl")
    keys = [(r["step"], r["family"]) for r in rows]
    assert len(keys) == len(set(keys))
    assert sorted(keys) == sorted((s, f) for s in (2, 4, 6, 8, 10) for f in FAMILIES)
    # The base labels came from the checkpoint: the resumed labeler only ever saw post-unlearning generations
    # (checkpoints 6, 8, 10; 6 prompts in batches of 4 = 2 calls each), never a base pass.
    assert [n for _, _, n in labeler.calls] == [4, 2] * 3
    ckpt = torch.load(root / "ckpt" / "step=4.ckpt", weights_only=False)
    sce_state = next(v for k, v in ckpt["callbacks"].items() if k.startswith("SCEEvaluation"))
    assert [r["step"] for r in sce_state["rows"]] == [2, 4]
    assert set(sce_state["base"]["reproduced"]) == {p["id"] for p in PROMPTS}
    drift_state = next(v for k, v in ckpt["callbacks"].items() if k.startswith("RetainDriftEvaluation"))
    assert drift_state["base"]["ce"] > 0


def test_row_contents(resumed_run):
    root, _, _ = resumed_run
    rows = read_rows(root / "run" / "version_0" / "checkpoint_metrics.jsonl")
    sce = [r for r in rows if r["family"] == "sce"]
    for r in sce:
        assert set(r["levels"]) == {"L0", "L1", "L2", "L3"}
        assert r["pooled"]["N"] == 5  # L0–L2 only; L3 is reported but never pooled
        p = r["pooled"]
        assert p["sce"] == pytest.approx(p["s"] * (1 - p["g"]) ** 2)
    drift = [r for r in rows if r["family"] == "retain_drift"]
    assert all(r["kl"] >= 0 for r in drift) and drift[-1]["kl"] > 0
    assert all(r["delta_ce"] == pytest.approx(r["ce"] - r["base_ce"]) for r in drift)
    mem = next(r for r in rows if r["family"] == "memorization")
    assert set(mem) >= {"forget", "retain"} and 0 <= mem["forget"]["es"] <= 1
    util = next(r for r in rows if r["family"] == "utility")
    assert util["num_items"] == 3 and util["accuracy"] in (0, 1 / 3, 2 / 3, 1)
    selection = json.loads((root / "run" / "version_0" / "selection.json").read_text())
    best = max(sce, key=lambda r: (r["pooled"]["sce"], -r["step"]))
    assert selection["suppression_tradeoff"]["step"] == best["step"]
    assert selection["num_checkpoints"] == 5
    assert (root / "run" / "version_0" / "sce_heatmap.png").stat().st_size > 0


def test_tensorboard_has_scalars_heatmap_and_text(resumed_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, _, _ = resumed_run
    ea = EventAccumulator(str(root / "run" / "version_0"), size_guidance={"images": 0, "tensors": 0, "scalars": 0})
    ea.Reload()
    tags = ea.Tags()
    assert {"sce/pooled/sce", "retain_drift/kl", "memorization/forget/es", "utility/accuracy"} <= set(tags["scalars"])
    assert {e.step for e in ea.Scalars("sce/pooled/sce")} >= {2, 4, 6, 8, 10}
    assert "sce/heatmap" in tags["images"]
    assert "sce/generations/text_summary" in tags["tensors"]
    text = ea.Tensors("sce/generations/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "| id | level |" in text and "p0" in text


def test_validate_evaluates_a_saved_checkpoint(resumed_run, tiny_dir, tmp_path):
    root, _, _ = resumed_run
    out = tmp_path / "eval"
    module = TinyCausalLM(str(tiny_dir), lora=True)
    cbs = [
        SCEEvaluation(PROMPTS, StubLabeler(), max_new_tokens=6, batch_size=4, output_dir=str(out)),
        RetainDriftEvaluation(qa_records(), output_dir=str(out)),
        CheckpointSelection(output_dir=str(out)),
    ]
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=cbs,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.validate(module, qa_loader(module.tokenizer), ckpt_path=str(root / "ckpt" / "step=8.ckpt"))
    rows = read_rows(out / "checkpoint_metrics.jsonl")
    keys = {(r["step"], r["family"], r["fn"]) for r in rows}
    assert keys == {(8, "sce", "validate"), (8, "retain_drift", "validate")}
    fit_rows = read_rows(root / "run" / "version_0" / "checkpoint_metrics.jsonl")
    fit_drift = next(r for r in fit_rows if r["family"] == "retain_drift" and r["step"] == 8)
    val_drift = next(r for r in rows if r["family"] == "retain_drift")
    assert val_drift["ce"] == pytest.approx(fit_drift["ce"], abs=1e-5)
    assert val_drift["kl"] == pytest.approx(fit_drift["kl"], abs=1e-6)
    fit_sce = next(r for r in fit_rows if r["family"] == "sce" and r["step"] == 8)
    val_sce = next(r for r in rows if r["family"] == "sce")
    assert val_sce["pooled"] == fit_sce["pooled"]
    assert json.loads((out / "selection.json").read_text())["suppression_tradeoff"]["step"] == 8


@pytest.mark.parametrize("bar", [True, False], ids=["progress-bar", "no-progress-bar"])
def test_a_checkpoint_evaluation_shows_a_progress_bar(resumed_run, tiny_dir, tmp_path, capsys, bar):
    root, _, _ = resumed_run
    module = TinyCausalLM(str(tiny_dir), lora=True)
    cbs = [SCEEvaluation(PROMPTS, StubLabeler(), max_new_tokens=6, batch_size=2, output_dir=str(tmp_path)),
           RetainDriftEvaluation(qa_records(), batch_size=2, output_dir=str(tmp_path))]  # fmt: skip
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, callbacks=cbs, enable_progress_bar=bar,
                      enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
    trainer.validate(module, qa_loader(module.tokenizer), ckpt_path=str(root / "ckpt" / "step=8.ckpt"))
    err = capsys.readouterr().err
    for label in ("sce @ step 8", "retain_drift @ step 8"):
        assert (label in err) == bar  # enable_progress_bar: false turns them off with Lightning's own


@pytest.mark.parametrize("logger", ["none", "csv"])
def test_two_runs_in_one_directory_keep_their_own_rows_and_selection(tiny_dir, tmp_path, logger):
    from lightning.pytorch.loggers import CSVLogger

    dirs = []
    for steps in (4, 2):  # the second run is shorter: its selection must not see the first run's step 4
        module = TinyCausalLM(str(tiny_dir), lora=True, lr=1.0)
        sce = SCEEvaluation(PROMPTS, StubLabeler(), max_new_tokens=4, batch_size=4)
        trainer = Trainer(default_root_dir=tmp_path, max_steps=steps, accelerator="cpu", devices=1,
                          logger=False if logger == "none" else CSVLogger(tmp_path),
                          callbacks=[ModelCheckpoint(dirpath=tmp_path / f"ckpt{steps}", every_n_train_steps=2),
                                     sce, CheckpointSelection()],
                          enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                          num_sanity_val_steps=0)  # fmt: skip
        trainer.fit(module, qa_loader(module.tokenizer))
        dirs.append(Path(sce.metrics_path).parent)
        rows = read_rows(sce.metrics_path)
        assert [r["step"] for r in rows] == list(range(2, steps + 1, 2))
        selection = json.loads((dirs[-1] / "selection.json").read_text())
        assert selection["num_checkpoints"] == steps // 2 and selection["suppression_tradeoff"]["step"] <= steps
    assert dirs[0] != dirs[1] and dirs[0].parent == dirs[1].parent  # version_0 and version_1


def test_heatmap_and_generation_table_reach_wandb_and_csv_loggers(tiny_dir, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    module = TinyCausalLM(str(tiny_dir), lora=True, lr=1.0)
    loggers = [WandbLogger(save_dir=str(tmp_path), offline=True, project="lu-test"), CSVLogger(tmp_path)]
    trainer = Trainer(default_root_dir=tmp_path, max_steps=2, accelerator="cpu", devices=1, logger=loggers,
                      callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2),
                                 SCEEvaluation(PROMPTS, StubLabeler(), max_new_tokens=4, batch_size=4),
                                 CheckpointSelection()],
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(module, qa_loader(module.tokenizer))
    wandb.finish()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list((run / "files" / "media" / "images" / "sce").glob("heatmap_*.png"))
    tables = list((run / "files" / "media" / "table" / "sce").glob("*.table.json"))
    generations = next(json.loads(p.read_text()) for p in tables if "generations" in p.as_posix())
    assert generations["columns"][:2] == ["id", "level"] and len(generations["data"]) >= 1
    csv_media = Path(loggers[1].log_dir) / "media"
    assert (csv_media / "sce-heatmap-step=2.png").stat().st_size > 0
    assert (csv_media / "sce-generations-step=2.csv").read_text().startswith("id,level,")
    # The selection's HParams session: the objective and its arguments in hparams.yaml, its numbers in metrics.csv.
    hparams = yaml.safe_load((Path(loggers[1].log_dir) / "hparams.yaml").read_text())
    assert hparams["objective"] == "TinyCausalLM" and hparams["verdict"] in ("apparent forgetting", "unverified")
    with open(Path(loggers[1].log_dir) / "metrics.csv", encoding="utf-8", newline="") as f:
        selected = [r for r in csv.DictReader(f) if r.get("sce/selected/sce")]
    assert [float(r["sce/selected/step"]) for r in selected] == [2.0]
