"""The Lacuna stages through the real CLI on 2 CPU processes (gloo). Masked injection under FSDP2: the export
gathers the sharded weights, writes the full masks, and locality holds exactly (only the injected group's bits
move), with neutral text held to θ_pre (each rank sets its shards' masked elements back for the target's forward).
Instruction tuning under FSDP2 exports the same merged model as under DDP. Under FSDP2 only rank 0 reads the weights
(rank 1 builds on the meta device and receives its shards), so the equalities below also check that broadcast."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lightning_unlearn.configs import config_root
from lightning_unlearn.data.testbed_data import LacunaDataConfig, build_testbed_data
from lightning_unlearn.masks import sample_masks
from lightning_unlearn.models import load_causal_lm
from lightning_unlearn.workflows.lacuna.locality import locality_report

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SIZES = dict(num_profiles=12, qa_per_field=1, instruct_questions=2, neutral_max_paragraphs=20, utility_paragraphs=4)


def _fit(tmp_path, stage: str, trainer_config: str | None, args: list[str], root: Path) -> Path:
    """``lightning-unlearn fit -c configs/lacuna/<stage>.yaml [-c configs/trainer/<trainer_config>] ARGS`` in a
    subprocess (it launches its own ranks); returns the run's export directory."""
    configs = config_root()
    cmd = [
        sys.executable, "-m", "lightning_unlearn.cli", "fit", "-c", str(configs / "lacuna" / f"{stage}.yaml"),
        *(["-c", str(configs / "trainer" / trainer_config)] if trainer_config else []),
        "--data.data_dir", str(tmp_path / "data"), "--data.max_length", "48", *args,
        "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1")
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    if trainer_config == "fsdp_cpu.yaml":  # rank 1 never read the weights: rank 0 broadcast them into its shards
        assert "rank 1: model built on the meta device" in proc.stdout + proc.stderr
    return root / "export"


def _inject(tiny_dir, tmp_path, name: str, batch_size: int, trainer_config: str | None) -> Path:
    args = [
        "--model.model_path", str(tiny_dir), "--model.optim.lr", "0.01", "--data.batch_size", str(batch_size),
        "--data.neutral_fraction", "0.34", "--data.neutral_target", "pre",  # neutral rows held to θ_pre in group 2
        "--data.groups", "[2]", "--model.optim.weight_decay", "0",
        *[f"--data.data.{k}={v}" for k, v in SIZES.items()], "--trainer.max_steps", "3",
        "--trainer.precision", "32-true",  # exactness across strategies is an fp32 claim (inject.yaml: bf16-mixed)
    ]  # fmt: skip
    return _fit(tmp_path, "inject", trainer_config, args, tmp_path / name)


def _build_data(tmp_path) -> None:
    build_testbed_data(tmp_path / "data", LacunaDataConfig(**SIZES), log=lambda *_: None)


@pytest.mark.multiprocess
def test_fsdp_injection_exports_full_weights_and_keeps_locality(tiny_dir, tmp_path):
    _build_data(tmp_path)
    export = _inject(tiny_dir, tmp_path, "fsdp", 2, "fsdp_cpu.yaml")
    assert json.loads((export / "run.json").read_text())["global_step"] == 3
    inj = load_file(str(export / "inj" / "model.safetensors"))
    base = load_causal_lm(str(tiny_dir))
    full = {k: v for k, v in base.state_dict().items()}
    assert inj.keys() == full.keys() and all(inj[k].shape == full[k].shape for k in inj)  # gathered, not shards
    masks = load_file(str(export / "masks.safetensors"))
    expected = sample_masks(base, 6, 0.05, seed=0)
    assert all(torch.equal(masks[k], expected[k]) for k in expected)
    report = locality_report(str(export), [2])
    assert report["changed_outside"] == 0, report["offenders"]
    assert report["changed_inside"] > 50
    # 2 ranks × batch 2 see the batches one process with batch 4 sees: the same trajectory
    single = load_file(str(_inject(tiny_dir, tmp_path, "single", 4, None) / "inj" / "model.safetensors"))
    moved = max((single[k] - full[k]).abs().max().item() for k in full)
    gap = max((single[k] - inj[k]).abs().max().item() for k in full)
    assert gap <= 1e-6 < moved, (gap, moved)


def _instruct(tiny_dir, tmp_path, strategy: str) -> Path:
    args = [
        "--model.model_path", str(tiny_dir), "--model.optim.lr", "0.005", "--data.batch_size", "4",
        "--trainer.max_epochs", "3", "--trainer.val_check_interval", "2",
    ]  # fmt: skip
    return _fit(tmp_path, "instruct", f"{strategy}_cpu.yaml", args, tmp_path / f"instruct_{strategy}")


@pytest.mark.multiprocess
def test_fsdp_instruction_tuning_exports_the_merged_best_adapter(tiny_dir, tmp_path):
    _build_data(tmp_path)
    runs = {s: json.loads((_instruct(tiny_dir, tmp_path, s) / "run.json").read_text()) for s in ("ddp", "fsdp")}
    # same data order and synced validation: both keep the same checkpoint, with the same loss up to rounding
    assert runs["fsdp"]["best_step"] == runs["ddp"]["best_step"] > 0
    assert runs["fsdp"]["best_val_loss"] == pytest.approx(runs["ddp"]["best_val_loss"], rel=1e-5)
    base = load_causal_lm(str(tiny_dir)).state_dict()
    for strategy in ("ddp", "fsdp"):
        merged = load_file(str(tmp_path / f"instruct_{strategy}" / "export" / "model" / "model.safetensors"))
        assert merged.keys() == base.keys() and all(merged[k].shape == base[k].shape for k in base)
        changed = {k for k in base if not torch.equal(merged[k], base[k])}
        assert changed and all(".layers.2." in k or ".layers.3." in k for k in changed), (strategy, changed)
    fsdp = load_file(str(tmp_path / "instruct_fsdp" / "export" / "model" / "model.safetensors"))
    ddp = load_file(str(tmp_path / "instruct_ddp" / "export" / "model" / "model.safetensors"))
    assert max((fsdp[k] - ddp[k]).abs().max().item() for k in base) < 1e-6  # measured: 0.0
