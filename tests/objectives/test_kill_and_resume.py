"""A run killed with SIGKILL (a real subprocess) and resumed with ``--ckpt_path last`` ends exactly where the
uninterrupted run ends: the same trainable weights and the same evaluation rows, each (step, family) once.

The run is the one resumes break most easily: LoRA NPO with dropout 0.05 (the shipped LENS config), batch 2 over a
6-row forget set, so an epoch is 3 batches and a checkpoint every 2 steps falls mid-epoch every other time, with two
evaluation families at every checkpoint.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import FORGET, RETAIN, npo_run_config, write_jsonl

from lightning_unlearn.callbacks.checkpoint_metrics_file import METRICS_FILE, read_rows

HERE = Path(__file__).resolve().parent
MAX_STEPS = 14
# Over lens/<method>.yaml: RMU on the testbed's 4 blocks.
METHOD_ARGS = {"npo": {}, "rmu": {"layer": 2}}


def _config(tmp: Path, testbed, kill: tuple[str, int] | None, ddp: bool, method: str = "npo") -> Path:
    forget = tmp / "forget6.jsonl"
    write_jsonl(forget, FORGET + RETAIN[:2])
    moment, step = kill or ("step", 10_000)
    records = str(testbed.retain)
    callbacks = [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
         "init_args": {"every_n_train_steps": 2, "save_top_k": -1, "filename": "{step}"}},
        {"class_path": "lightning_unlearn.callbacks.RetainDriftEvaluation",
         "init_args": {"records": records, "batch_size": 4}},
        {"class_path": "kill_points.KillAt", "init_args": {"moment": moment, "step": step}},
        {"class_path": "lightning_unlearn.callbacks.MemorizationEvaluation",
         "init_args": {"splits": {"forget": str(forget)}, "max_new_tokens": 6}},
    ]  # fmt: skip
    trainer = {"default_root_dir": str(tmp / "run"), "max_steps": MAX_STEPS}
    if ddp:
        trainer.update(devices=2, strategy="ddp")
    config = npo_run_config(testbed, forget, callbacks, **trainer)
    config["model"]["init_args"].update(METHOD_ARGS[method])
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fit(config: Path, *extra: str, method: str = "npo") -> subprocess.CompletedProcess:
    # A fresh rendezvous port each run, and no rank variables from this process's environment.
    leftovers = ("LOCAL_RANK", "RANK", "NODE_RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in leftovers}
    env.update(PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]), HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))  # fmt: skip
    cmd = [sys.executable, "-m", "lightning_unlearn.cli", "fit", "-c", f"lens/{method}.yaml", "-c", str(config), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _outcome(root: Path) -> tuple[dict[str, torch.Tensor], dict[tuple[int, str], dict]]:
    """The trainable weights of the final checkpoint and the metric rows of the run's newest log directory."""
    final = next(root.rglob(f"step={MAX_STEPS}.ckpt"))
    state = torch.load(final, map_location="cpu", weights_only=True)["state_dict"]
    weights = {k: v for k, v in state.items() if "lora_" in k}
    files = sorted(root.rglob(METRICS_FILE), key=lambda p: p.stat().st_mtime_ns)
    rows = read_rows(files[-1])
    keyed = {}
    for row in rows:
        key = (int(row["step"]), row["family"])
        assert key not in keyed, f"row {key} twice in {files[-1]}"
        keyed[key] = {k: v for k, v in row.items() if k not in ("seconds", "fn", "epoch")}
    return weights, keyed


def _assert_same(resumed, reference) -> None:
    (w_res, rows_res), (w_ref, rows_ref) = resumed, reference
    assert w_res.keys() == w_ref.keys() and w_ref
    for k in w_ref:
        assert torch.allclose(w_res[k], w_ref[k], atol=1e-6, rtol=0), (k, (w_res[k] - w_ref[k]).abs().max())
    assert rows_res.keys() == rows_ref.keys()
    assert len(rows_ref) == 2 * (MAX_STEPS // 2)
    for key, ref in rows_ref.items():
        got = rows_res[key]
        assert got.keys() == ref.keys(), key
        for name, value in ref.items():
            if isinstance(value, float):
                assert got[name] == pytest.approx(value, abs=1e-6), (key, name)
            else:
                assert got[name] == value, (key, name)


def _uninterrupted(tmp: Path, testbed, ddp: bool, method: str = "npo"):
    done = _fit(_config(tmp, testbed, None, ddp=ddp, method=method), method=method)
    assert done.returncode == 0, done.stderr[-3000:]
    return _outcome(tmp / "run")


@pytest.fixture(scope="module")
def reference(testbed, tmp_path_factory):
    return _uninterrupted(tmp_path_factory.mktemp("uninterrupted"), testbed, ddp=False)


def _kill_and_resume(tmp: Path, testbed, moment: str, step: int, ddp: bool = False, method: str = "npo", *extra: str):
    config = _config(tmp, testbed, (moment, step), ddp, method)
    killed = _fit(config, method=method)
    assert killed.returncode == -9, f"the run was not killed (rc {killed.returncode}): {killed.stderr[-3000:]}"
    assert not list((tmp / "run").rglob(f"step={MAX_STEPS}.ckpt"))
    # the resumed run: the same config, no kill point reached again
    config.write_text(config.read_text().replace(f"step: {step}", "step: 10000"))
    resumed = _fit(config, "--ckpt_path", "last", *extra, method=method)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # the same run: it went on writing in its own version directory, not in a new one
    assert [p.name for p in (tmp / "run" / "lightning_logs").iterdir()] == ["version_0"]
    return resumed


@pytest.mark.parametrize(
    ("moment", "step", "resumes_from"),
    [("step", 5, 4), ("write", 8, 6), ("evaluation", 10, 8)],
    ids=["mid-epoch", "during-checkpoint-write", "during-evaluation"],
)
@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(testbed, tmp_path, reference, moment, step, resumes_from):
    resumed = _kill_and_resume(tmp_path, testbed, moment, step)
    assert f"step={resumes_from}.ckpt" in resumed.stderr, resumed.stderr[-3000:]
    if moment == "write":
        assert "corrupt" in resumed.stderr  # the cut-off step=8.ckpt was skipped, with a warning
    _assert_same(_outcome(tmp_path / "run"), reference)


@pytest.fixture(scope="module")
def ddp_reference(testbed, tmp_path_factory):
    return _uninterrupted(tmp_path_factory.mktemp("uninterrupted_ddp"), testbed, ddp=True)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_killed_ddp_run_resumes_to_the_uninterrupted_result(testbed, tmp_path, ddp_reference):
    _kill_and_resume(tmp_path, testbed, "step", 5, ddp=True)
    _assert_same(_outcome(tmp_path / "run"), ddp_reference)


@pytest.fixture(scope="module")
def rmu_reference(testbed, tmp_path_factory):
    return _uninterrupted(tmp_path_factory.mktemp("uninterrupted_rmu"), testbed, ddp=False, method="rmu")


@pytest.mark.slow
def test_killed_rmu_run_resumes_to_the_uninterrupted_result_with_the_checkpoints_u(testbed, tmp_path, rmu_reference):
    # The resumed run is told another steering_seed: it still steers toward the checkpoint's u, so it ends where the
    # uninterrupted run (steering_seed 0) ends.
    resumed = _kill_and_resume(tmp_path, testbed, "step", 5, False, "rmu", "--model.init_args.steering_seed=1")
    assert "step=4.ckpt" in resumed.stderr, resumed.stderr[-3000:]
    _assert_same(_outcome(tmp_path / "run"), rmu_reference)
    final = torch.load(next((tmp_path / "run").rglob(f"step={MAX_STEPS}.ckpt")), weights_only=True)
    reference = torch.load(next((tmp_path / "run").rglob("step=2.ckpt")), weights_only=True)  # before the kill
    assert torch.equal(final["state_dict"]["control_vector"], reference["state_dict"]["control_vector"])
