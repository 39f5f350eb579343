"""`lightning-unlearn sweep`: the cells of a 2 × 2 grid; a tiny two-cell sweep on the local executor, killed mid-way
and re-run (each cell's rows once, finished cells not re-trained), the same sweep through submitit's LocalExecutor
(the same rows), and the sbatch script of an array and of a 2-node cell."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import FORGET, RETAIN, npo_run_config, write_jsonl

from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows
from lightning_unlearn.workflows.sweep import (
    DONE_FILE,
    cell_command,
    load_sweep,
    sbatch_script,
    submitit_parameters,
    sweep_command,
)

GRID = {"model.init_args.optim.lr": [5.0e-3, 1.0e-2], "seed_everything": [0, 1]}
# The killed sweep's cells: the second has another learning rate and another seed than the first. Two cells are enough
# for one finished and one part-way at the kill (each cell is a fit subprocess, ~6 s of imports here).
TWO_CELLS = [{"model.init_args.optim.lr": 5.0e-3, "seed_everything": 0},
             {"model.init_args.optim.lr": 1.0e-2, "seed_everything": 1}]  # fmt: skip


def _base(tmp: Path, testbed) -> Path:
    forget = tmp / "forget6.jsonl"
    write_jsonl(forget, FORGET + RETAIN[:2])
    callbacks = [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
         "init_args": {"every_n_train_steps": 2, "save_top_k": -1, "filename": "{step}"}},
        {"class_path": "lightning_unlearn.callbacks.RetainDriftEvaluation",
         "init_args": {"records": str(testbed.retain), "batch_size": 4}},
    ]  # fmt: skip
    config = npo_run_config(testbed, forget, callbacks, max_steps=8)
    path = tmp / "base.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _sweep_file(
    tmp: Path, base: Path, root: Path, kind: str, cells: list[dict] | None = None, parallel: int = 2
) -> Path:
    """The sweep of the :data:`GRID`, or with ``cells`` of those cells alone."""
    spec = {
        "base": ["lens/npo.yaml", str(base)],
        "root": str(root),
        **({"grid": GRID} if cells is None else {"cells": cells}),
        "executor": {"kind": kind, "parallel": parallel, "threads": 1, "timeout_min": 10},
    }
    path = tmp / f"sweep-{kind}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _rows(cell_dir: Path) -> list[dict]:
    files = list(cell_dir.rglob("checkpoint_metrics.jsonl"))
    assert len(files) == 1, files  # a resumed cell writes on in its own run directory
    return read_rows(files[0])


def _comparable(rows: list[dict]) -> dict:
    return {(r["step"], r["family"]): {k: v for k, v in r.items() if k != "seconds"} for r in rows}


@pytest.fixture(scope="module")
def base(testbed, tmp_path_factory):
    return _base(tmp_path_factory.mktemp("sweep_base"), testbed)


def test_dry_run_lists_cells_with_readable_ids_and_digests(base, tmp_path):
    out = sweep_command(_sweep_file(tmp_path, base, tmp_path / "root", "local"), dry_run=True)
    names = [c["name"] for c in out["cells"]]
    assert len(names) == len(set(names)) == 4
    assert all(c["state"] == "new" for c in out["cells"]) and not (tmp_path / "root").exists()
    assert any(n.startswith("0.005-0-") for n in names)
    assert all("--model.init_args.optim.lr" in c["command"] for c in out["cells"])


@pytest.mark.multiprocess
def test_killed_sweep_resumes_each_cell_once_and_submitit_gives_the_same_rows(base, tmp_path):
    root = tmp_path / "local"
    # one cell at a time: the first has finished before the second starts, so the kill finds one of each
    spec = _sweep_file(tmp_path, base, root, "local", TWO_CELLS, parallel=1)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).parent))
    sweep = subprocess.Popen(
        [sys.executable, "-m", "lightning_unlearn.cli", "sweep", "-c", str(spec)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # Kill it once a cell has finished and another is part-way (a checkpoint, no done marker).
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        dirs = [d for d in root.glob("*") if d.is_dir() and d.name != "submitit"]
        done = [d for d in dirs if (d / DONE_FILE).exists()]
        partway = [d for d in dirs if not (d / DONE_FILE).exists() and list(d.rglob("step=*.ckpt"))]
        if done and partway:
            break
        assert sweep.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.2)
    else:
        pytest.fail("no cell finished within 300 s")
    cells = psutil.Process(sweep.pid).children(recursive=True)
    sweep.send_signal(signal.SIGKILL)
    sweep.wait()
    # its cells get SIGTERM from the kernel (they die with their parent): wait for that, not for a fixed time
    _, alive = psutil.wait_procs(cells, timeout=60)
    assert not alive, alive
    finished = {d.name: (d / DONE_FILE).read_text() for d in done}
    ckpt_times = {p: p.stat().st_mtime_ns for d in done for p in d.rglob("*.ckpt")}

    result = sweep_command(spec)
    states = {c["name"]: c["state"] for c in result["cells"]}
    assert all(states[name] == "done" for name in finished)
    assert any(states[d.name] == "resume" for d in partway)
    for name, text in finished.items():
        assert (root / name / DONE_FILE).read_text() == text  # not re-trained
    assert all(p.stat().st_mtime_ns == t for p, t in ckpt_times.items())
    local = {}
    for cell in load_sweep(spec).cells:
        rows = _rows(cell.directory)
        keys = [(r["step"], r["family"]) for r in rows]
        assert sorted(keys) == [(s, "retain_drift") for s in (2, 4, 6, 8)]
        local[cell.name] = _comparable(rows)
    # the two cells trained differently (each its own learning rate and seed)
    assert len(local) == 2 and len({json.dumps(rows[(8, "retain_drift")]["kl"]) for rows in local.values()}) == 2

    spec2 = _sweep_file(tmp_path, base, tmp_path / "submitit", "submitit-local", TWO_CELLS)
    sweep_command(spec2)
    for cell in load_sweep(spec2).cells:
        got = _comparable(_rows(cell.directory))
        want = local[cell.name]
        assert got.keys() == want.keys()
        for key in want:
            for field in ("ce", "kl", "delta_ce"):
                assert got[key][field] == pytest.approx(want[key][field], abs=1e-6), (cell.name, key, field)


def test_a_cell_directory_of_another_recipe_is_refused(base, tmp_path):
    from lightning_unlearn.workflows.sweep import check_cell

    spec = _sweep_file(tmp_path, base, tmp_path / "root", "local")
    sweep = load_sweep(spec)
    cell = sweep.cells[0]
    assert check_cell(sweep, cell) == "new"
    assert check_cell(sweep, cell) == "resume"
    other = base.with_name("other.yaml")
    other.write_text(base.read_text().replace("max_steps: 8", "max_steps: 9"))
    sweep.base[1] = str(other)
    with pytest.raises(ValueError, match="was built with other config files"):
        check_cell(sweep, cell)


def test_sbatch_of_an_array_and_of_a_two_node_fsdp_cell(base, tmp_path):
    spec = {
        "base": ["lens/npo.yaml", str(base)],
        "root": str(tmp_path / "root"),
        "grid": GRID,
        "cells": [{}, {"trainer.strategy.class_path": "lightning_unlearn.strategies.MaskedFSDPStrategy",
                       "resources": {"nodes": 2, "tasks_per_node": 2, "gpus_per_node": 2, "timeout_min": 240}}],
        "executor": {"kind": "slurm", "parallel": 3, "timeout_min": 30,
                     "slurm": {"partition": "gpu", "account": "lab"}},
    }  # fmt: skip
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    array = [c for c in sweep.cells if not c.resources]
    two_node = [c for c in sweep.cells if c.resources]
    assert len(array) == 4 and len(two_node) == 4
    text = sbatch_script(tmp_path / "sub", submitit_parameters(sweep.executor), array_size=len(array))
    lines = set(text.splitlines())
    assert {"#SBATCH --array=0-3%3", "#SBATCH --time=30", "#SBATCH --partition=gpu", "#SBATCH --account=lab",
            "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1"} <= lines  # fmt: skip
    text = sbatch_script(tmp_path / "sub", submitit_parameters(sweep.executor, two_node[0]))
    lines = set(text.splitlines())
    assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --gpus-per-node=2",
            "#SBATCH --time=240"} <= lines  # fmt: skip
    assert not any(line.startswith("#SBATCH --array") for line in lines)
    shown = sweep_command(path, dry_run=True)["sbatch"]
    assert "#SBATCH --array=0-3%3" in shown["array"] and len(shown) == 5
    # each task of the 2-node job is one Lightning rank: the fit is told its world
    cmd = cell_command(sweep, two_node[0], nodes=2, devices=2).args()
    assert cmd[cmd.index("--trainer.num_nodes") + 1] == "2" and cmd[cmd.index("--trainer.devices") + 1] == "2"


def test_a_multi_node_cell_on_the_local_executor_is_refused(base, tmp_path):
    spec = {"base": [str(base)], "root": str(tmp_path / "root"), "cells": [{"resources": {"nodes": 2}}]}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match="several nodes, which executor.kind 'local' cannot give"):
        load_sweep(path)


def test_evaluation_jobs_are_one_array_of_single_task_jobs_with_their_own_resources(base, tmp_path):
    """`sweep --evaluate true` on slurm: every finished cell's evaluation, the 2-node FSDP cells' too, is one task
    of one array with `evaluate.resources`, since `evaluate` runs in one process per job."""
    spec = {
        "base": ["lens/npo.yaml", str(base)],
        "root": str(tmp_path / "root"),
        "cells": [{"seed_everything": 0},
                  {"seed_everything": 1, "resources": {"nodes": 2, "tasks_per_node": 2, "gpus_per_node": 2}}],
        "evaluate": {"resources": {"gpus_per_node": 1, "timeout_min": 20}},
        "executor": {"kind": "slurm", "parallel": 4, "timeout_min": 240},
    }  # fmt: skip
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    cells = load_sweep(path).cells
    cells[0].directory.mkdir(parents=True)
    (cells[0].directory / DONE_FILE).write_text("{}")
    shown = sweep_command(path, dry_run=True, evaluate=True)
    assert shown["jobs"] == [{"cell": cells[0].name, "steps": None}] and shown["not_finished"] == [cells[1].name]
    (cells[1].directory).mkdir(parents=True)
    (cells[1].directory / DONE_FILE).write_text("{}")
    shown = sweep_command(path, dry_run=True, evaluate=True)
    assert len(shown["jobs"]) == 2 and not (tmp_path / "root" / "submitit").exists()  # nothing submitted
    lines = set(shown["sbatch"]["evaluate"].splitlines())
    assert {"#SBATCH --array=0-1%2", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=1",
            "#SBATCH --time=20"} <= lines  # fmt: skip
    spec["evaluate"] = {"resources": {"nodes": 2}}
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match="an evaluation job is one task on one node"):
        load_sweep(path)


@pytest.mark.parametrize("value", [0, 1.5, True])
def test_steps_per_job_must_be_a_whole_number(base, tmp_path, value):
    spec = {"base": [str(base)], "root": str(tmp_path / "root"), "evaluate": {"steps_per_job": value}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match="evaluate.steps_per_job=.* must be a whole number"):
        load_sweep(path)
    spec["evaluate"] = {"steps_per_job": 2}
    path.write_text(yaml.safe_dump(spec))
    assert load_sweep(path).evaluate == {"steps_per_job": 2}


def test_a_shipped_sweep_file_is_found_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no such local file: the shipped one
    methods = ["npo", "tofu_ga", "rmu", "idk_dpo", "undial"]
    assert [c.label for c in load_sweep("sweeps/lens_smollm2.yaml").cells] == methods * 2  # × 2 narratives
    with pytest.raises(FileNotFoundError, match="nor a shipped one"):
        load_sweep("sweeps/nonexistent.yaml")
