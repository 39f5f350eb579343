"""The LENS trajectory chain of scripts/lens_trajectory.sh, end to end on a tiny random model and the demo narrative:
baseline → forget set → retain set → LoRA NPO fit with the shipped lens/smollm2_trajectory.yaml (every checkpoint
evaluated) → selection.json + heatmap → cross-run report → per-level summary at the selected checkpoint."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest
from tensorboard_events import events as _events
from tensorboard_events import session as _session

from lightning_unlearn import cli
from lightning_unlearn.configs import config_root
from lightning_unlearn.workflows import report
from lightning_unlearn.workflows.lens import main as lens_main
from lightning_unlearn.workflows.lens.summary import format_summary, trajectory_summary

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = config_root() / "lens" / "smollm2_trajectory.yaml"
TEMPLATE_RUN = "runs/lens/smollm2/nato-forced-war-en"
NARRATIVE = "demo-canal-tolls"
# Every TensorBoard tag and HParams name docs/guide/evaluation.md ("Compare trajectories in TensorBoard") names: a
# renamed one fails here. The run's own event file …
RUN_SCALARS = [
    *(f"sce/levels/{lv}/sce" for lv in ("L0", "L1", "L2", "L3", "L3-special")),
    "sce/pooled/sce", "sce/pooled/sce_health", "sce/pooled/sce_strict", "sce/pooled/s", "sce/pooled/g",
    "sce/validity/refusal", "sce/degraded_rate", "retain_drift/delta_ce", "retain_drift/kl", "sce/selected_step",
    "hp_metric", "train/loss",
]  # fmt: skip
RUN_IMAGES = ["sce/heatmap"]
RUN_TEXTS = ["sce/generations", "sce/verdict"]
# … and the HParams session of its selection, the run <log_dir>/selection (a sweep cell's also has SWEEP_HPARAMS).
SESSION_HPARAMS = ["objective", "model.init_args.optim.lr", "verdict", "failed_guards", "guarded_verdict"]
SESSION_METRICS = [
    *(f"sce/selected/{k}" for k in ("step", "sce", "sce_health", "sce_strict", "s", "g", "g_health", "g_strict",
                                     "retain_delta_ce", "useful")),
    "hp_metric",
]  # fmt: skip
# (sce/guarded/step, sce/guarded/sce and sce/first_collapse/step: when the selection has them; score/*: a score
# selection's, tests/callbacks/test_checkpoint_selection.py)
SWEEP_HPARAMS = ["sweep.cell", "sweep.label", "sweep.panel", "configs", "trainer.max_steps"]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _trajectory_config(out: Path, every: int, max_new_tokens: int) -> Path:
    """The template with the run directory replaced (as the script does) and the sizes shrunk for a tiny model."""
    text = TEMPLATE.read_text(encoding="utf-8")
    assert TEMPLATE_RUN in text
    text = text.replace(TEMPLATE_RUN, str(out))
    text = text.replace("every_n_train_steps: 10", f"every_n_train_steps: {every}")
    text = text.replace("max_new_tokens: 60", f"max_new_tokens: {max_new_tokens}")
    cfg = out / "npo.trajectory.yaml"
    cfg.write_text(text, encoding="utf-8")
    return cfg


@pytest.fixture(scope="module")
def trajectory(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("lens_trajectory")
    model = str(tiny_dir)
    common = [
        "--model",
        model,
        "--narrative",
        NARRATIVE,
        "--language",
        "en",
        "--max_new_tokens",
        "6",
        "--batch_size",
        "64",
        "--threads",
        "1",
    ]
    # 1. Base answers to every level, signature-labeled.
    lens_main(["baseline", *common, "--labeler", "signature", "--out", str(out / "baseline.jsonl")])
    # 2. Forget set. A random model reproduces no narrative, so the weak labeler would keep nothing: mark every L0
    #    answer Target-Dominant in the annotation CSV (the strict path of the same import command).
    lens_main(["export", "--baseline", str(out / "baseline.jsonl"), "--out", str(out / "annotate.csv")])
    with open(out / "annotate.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(out / "labels.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "label"])
        writer.writeheader()
        writer.writerows({"id": r["id"], "label": "Target-Dominant"} for r in rows)
    lens_main(
        [
            "import",
            "--baseline",
            str(out / "baseline.jsonl"),
            "--labels",
            str(out / "labels.csv"),
            "--out",
            str(out / "forget_weak.jsonl"),
        ]
    )
    # 3. Retain set: the base model's answers to other prompts (here the suite's L3 level).
    lens_main(["baseline", *common, "--levels", "[L3]", "--out", str(out / "retain.jsonl")])
    # 4. The trajectory: the same two configs as the script, 6 steps, a checkpoint every 2.
    cfg = _trajectory_config(out, every=2, max_new_tokens=6)
    cli.main(
        [
            "fit",
            "-c",
            "lens/npo.yaml",
            "-c",
            str(cfg),
            "--model.init_args.model_path",
            model,
            "--data.init_args.tokenizer_path",
            model,
            "--trainer.max_steps",
            "6",
            "--trainer.default_root_dir",
            str(out),
            "--trainer.logger.init_args.save_dir",
            str(out),
            "--trainer.logger.init_args.name",
            "npo",
        ]
    )
    return out


def test_trajectory_artifacts(trajectory):
    run = trajectory / "npo" / "trajectory"
    baseline = _rows(trajectory / "baseline.jsonl")
    per_level = {lv: sum(r["level"] == lv for r in baseline) for lv in {r["level"] for r in baseline}}
    assert {"L0", "L1", "L2", "L3", "L3-special"} <= set(per_level)

    metrics = _rows(run / "checkpoint_metrics.jsonl")
    assert sorted((r["step"], r["family"]) for r in metrics) == [
        (s, f) for s in (2, 4, 6) for f in ("retain_drift", "sce")
    ]
    for r in metrics:
        if r["family"] == "sce":
            assert {lv: v["N"] for lv, v in r["levels"].items()} == per_level
            assert r["pooled"]["N"] == per_level["L0"] + per_level["L1"] + per_level["L2"]
            assert 0.0 <= r["degraded_rate"] <= 1.0
        else:
            assert r["ce"] > 0 and r["kl"] >= 0 and "delta_ce" in r
    # The first checkpoint has moved away from the base: the adapter is trained.
    drift = {r["step"]: r for r in metrics if r["family"] == "retain_drift"}
    assert drift[6]["kl"] > 0

    selection = json.loads((run / "selection.json").read_text())
    assert selection["num_checkpoints"] == 3
    assert selection["suppression_tradeoff"]["step"] in (2, 4, 6)
    assert (run / "sce_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for step in (2, 4, 6):
        assert (run / "checkpoints" / f"adapter-step={step}" / "adapter_config.json").is_file()
    assert list(run.glob("events.out.tfevents.*"))
    forget_meta = json.loads((trajectory / "forget_weak.meta.json").read_text())
    assert forget_meta["n_forget"] == per_level["L0"]


def _assert_session_matches(hparams: dict, metrics: dict, selection: dict) -> None:
    """The session records the objective and the selected checkpoint of ``selection`` (``selection.json``)."""
    assert set(SESSION_HPARAMS) <= set(hparams), sorted(set(SESSION_HPARAMS) - set(hparams))
    assert set(SESSION_METRICS) <= set(metrics), sorted(set(SESSION_METRICS) - set(metrics))
    point = selection["suppression_tradeoff"]
    assert hparams["verdict"] == point["verdict"].partition(":")[0]
    failed = [name for name, guard in point["guards"].items() if guard["holds"] is False]
    assert hparams["failed_guards"] == (", ".join(failed) or "none")
    assert metrics["sce/selected/step"] == point["step"]
    for key in ("sce", "sce_health", "sce_strict", "s", "g", "retain_delta_ce"):
        assert metrics[f"sce/selected/{key}"] == pytest.approx(point[key], abs=1e-6), key
    assert metrics["hp_metric"] == pytest.approx(point["sce"], abs=1e-6)
    assert metrics["sce/selected/useful"] == float(point["verdict"] == "useful operating point")
    guarded, collapse = selection["guarded"], selection["first_collapse"]
    assert metrics.get("sce/guarded/step") == (guarded and guarded["step"])
    assert metrics.get("sce/guarded/sce") == (guarded and pytest.approx(guarded["sce"], abs=1e-6))
    assert metrics.get("sce/first_collapse/step") == (collapse and collapse["step"])


def test_tensorboard_holds_the_per_level_sce_the_heatmap_the_answers_and_the_selections_hparams(trajectory):
    """The run's event file has the guide's tags (per-level SCE at every evaluated step, the heatmap, the answers
    and verdict as text) and no hp_metric -1 session; its selection is one HParams session: the objective and its
    init arguments against the selected checkpoint's SCE, s, g, retain ΔCE and verdict."""
    run = trajectory / "npo" / "trajectory"
    events = _events(run)
    tags = events.Tags()
    assert set(RUN_SCALARS) <= set(tags["scalars"]), sorted(set(RUN_SCALARS) - set(tags["scalars"]))
    for level in ("L0", "L1", "L2"):
        assert [e.step for e in events.Scalars(f"sce/levels/{level}/sce")] == [2, 4, 6]
    assert tags["images"] == RUN_IMAGES
    assert events.Images("sce/heatmap")[-1].encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"
    assert {t.removesuffix("/text_summary") for t in tags["tensors"]} == set(RUN_TEXTS)
    answers = events.Tensors("sce/generations/text_summary")[-1].tensor_proto.string_val[0].decode()
    first = _rows(run / "sce_generations" / "step=6.jsonl")[0]
    assert answers.startswith("| id | level |") and f"| {first['id']} | {first['level']} |" in answers
    with pytest.raises(KeyError):  # no hp_metric -1 session in the run itself (default_hp_metric: false)
        events.PluginTagToContent("hparams")

    selection = json.loads((run / "selection.json").read_text())
    assert ("sce/guarded_step" in tags["scalars"]) == (selection["guarded"] is not None)
    assert events.Scalars("hp_metric")[-1].value == pytest.approx(selection["suppression_tradeoff"]["sce"], abs=1e-6)
    hparams, metrics = _session(run / "selection")
    assert hparams["objective"] == "NPO"
    assert hparams["model.init_args.beta"] == pytest.approx(0.1) and hparams["model.init_args.optim.lr"] == 2.0e-4
    assert hparams["model.init_args.optim.betas"] == "[0.9, 0.999]" and hparams["model.init_args.adapter.r"] == 8
    _assert_session_matches(hparams, metrics, selection)


def test_report_and_summary(trajectory, capsys):
    run = trajectory / "npo"
    report.main([str(run), "--out", str(trajectory / "report")])
    assert (trajectory / "report" / "sce_heatmap.png").is_file()
    assert "| npo | 3 |" in (trajectory / "report" / "summary.md").read_text()

    summary = trajectory_summary(run, trajectory / "baseline.jsonl")
    assert summary["steps"] == [2, 4, 6]
    assert list(summary["levels"]) == ["L0", "L1", "L2", "pooled", "L3", "L3-special"]
    pooled = summary["levels"]["pooled"]
    assert pooled["N"] == sum(summary["levels"][lv]["N"] for lv in ("L0", "L1", "L2"))
    assert pooled["B"] == sum(summary["levels"][lv]["B"] for lv in ("L0", "L1", "L2"))
    assert set(summary["entity_recovery"]["before"]) == {"L3", "L3-special"}
    assert {"ce", "delta_ce", "kl"} <= set(summary["retain_drift"])
    text = format_summary(summary)
    assert "suppression-tradeoff checkpoint: step" in text and "L3-special entity recovery: before" in text

    lens_main(["summary", str(run / "trajectory"), "--baseline", str(trajectory / "baseline.jsonl")])
    assert "pooled" in capsys.readouterr().out
    assert json.loads((run / "trajectory" / "trajectory_summary.json").read_text())["steps"] == [2, 4, 6]


def test_summary_rejects_unlabeled_baseline(trajectory):
    with pytest.raises(ValueError, match="not labeled"):
        trajectory_summary(trajectory / "npo", trajectory / "retain.jsonl")


def _numbers(value, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a row (bools and strings are compared as they are, elsewhere)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_numbers(v, f"{prefix}/{k}"))
        return out
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {prefix: float(value)}
    return {}


def _heldout_eval_config(folder: Path, trajectory: Path) -> Path:
    """An eval.yaml whose only callback is a second retain-drift family (``retain_drift:heldout``)."""
    path = folder / "eval.yaml"
    path.write_text(
        "trainer:\n  callbacks:\n"
        "    - class_path: lightning_unlearn.callbacks.RetainDriftEvaluation\n"
        f"      init_args: {{name: heldout, records: {trajectory / 'retain.jsonl'}, max_length: 64, batch_size: 8}}\n",
        encoding="utf-8",
    )
    return path


def _unevaluated_copy(run: Path, dest: Path) -> Path:
    """A copy of a finished run without its evaluation outputs (rows, selection, heatmap, generations)."""
    import shutil

    shutil.copytree(run, dest)
    for name in ("checkpoint_metrics.jsonl", "selection.json", "sce_heatmap.png"):
        (dest / name).unlink()
    shutil.rmtree(dest / "sce_generations")
    return dest


def _assert_same_rows(rows: list[dict], trained: dict) -> None:
    """Every row equals the in-training row of its (step, family) to ≤ 1e-6 (wall time and epoch aside)."""
    for r in rows:
        want = {k: v for k, v in _numbers(trained[(r["step"], r["family"])]).items() if k not in ("/seconds", "/epoch")}
        got = {k: v for k, v in _numbers(r).items() if k not in ("/seconds", "/epoch")}
        assert got.keys() == want.keys() and max(abs(got[k] - want[k]) for k in want) <= 1e-6, (r["step"], r["family"])


def test_evaluate_reproduces_the_training_rows_then_adds_a_family_without_duplicates(
    trajectory, tmp_path, caplog, capsys
):
    """`evaluate` on a copy of the finished LoRA run without its rows: the same rows and generated text as the
    in-training callbacks (step 6 from its checkpoint file, steps 2 and 4 from their adapter directories); then a
    new family from -c eval.yaml joins them, and a third run recomputes nothing."""

    from lightning_unlearn.workflows.evaluate import main as evaluate_main
    from lightning_unlearn.workflows.evaluate import saved_checkpoints

    run = trajectory / "npo" / "trajectory"
    copy = _unevaluated_copy(run, tmp_path / "run")
    kinds = {c.step: c.kind for c in saved_checkpoints(copy)}
    assert kinds == {2: "adapter", 4: "adapter", 6: "checkpoint"}

    # A newer checkpoint cut short (a killed or full-disk write): named, skipped, the good steps still evaluated.
    (good,) = [p for p in copy.rglob("*.ckpt") if p.is_file()]
    truncated = good.with_name("step=8.ckpt")
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="lightning_unlearn"):
        evaluate_main([str(copy)])
    printed = json.loads(capsys.readouterr().out)  # stdout is the result alone (no validate tables), for jq
    assert [e["step"] for e in printed["evaluated"]] == [2, 4, 6]
    assert any(str(truncated) in m and "not a complete checkpoint" in m for m in caplog.messages)
    truncated.unlink()
    trained = {(r["step"], r["family"]): r for r in _rows(run / "checkpoint_metrics.jsonl")}
    assert len({trained[(s, "retain_drift")]["kl"] for s in (2, 4, 6)}) == 3  # three different adapters
    rows = _rows(copy / "checkpoint_metrics.jsonl")
    assert sorted((r["step"], r["family"]) for r in rows) == sorted(trained)
    assert all(r["fn"] == "validate" for r in rows)
    _assert_same_rows(rows, trained)
    # Step 6's rows carry its checkpoint's epoch; the adapter directories' epochs are unknown here (the copy has no
    # training rows to read them from), so None rather than a made-up 0.
    assert {r["epoch"] for r in rows if r["step"] == 6} == {trained[(6, "sce")]["epoch"]}
    assert {r["epoch"] for r in rows if r["step"] in (2, 4)} == {None}
    for gen in sorted((run / "sce_generations").iterdir()):
        assert (copy / "sce_generations" / gen.name).read_text() == gen.read_text(), gen.name
    selection = json.loads((copy / "selection.json").read_text())
    assert selection == json.loads((run / "selection.json").read_text())

    # A family added after the fact: its rows join the existing ones, which stay as they were.
    eval_yaml = _heldout_eval_config(tmp_path, trajectory)
    evaluate_main([str(copy), "-c", str(eval_yaml)])
    after = _rows(copy / "checkpoint_metrics.jsonl")
    keys = [(r["step"], r["family"]) for r in after]
    assert len(keys) == len(set(keys))
    assert sorted(keys) == sorted([*trained, *((s, "retain_drift:heldout") for s in (2, 4, 6))])
    assert [r for r in after if r["family"] != "retain_drift:heldout"] == rows

    from lightning_unlearn.workflows.evaluate import evaluate_command

    with caplog.at_level(logging.INFO, logger="lightning_unlearn"):
        again = evaluate_command(copy, eval_config=[eval_yaml])
    assert again["evaluated"] == [] and [s["step"] for s in again["skipped"]] == [2, 4, 6]
    assert _rows(copy / "checkpoint_metrics.jsonl") == after
    # One validate learns the config's families; the steps after it load no model.
    loaded = [m.split(" from ")[0] for m in caplog.messages if m.startswith("evaluate: step") and " from " in m]
    assert loaded == ["evaluate: step 2"]

    # The adapter checkpoints' SCE in one mixed-adapter generation pass (step 6 too: its checkpoint file's adapter
    # is also saved as adapter-step=6/): the same rows and text again.
    mixed = _unevaluated_copy(run, tmp_path / "mixed")
    out = evaluate_command(mixed, adapters_per_pass=3)
    assert sorted(e["step"] for e in out["evaluated"] if e.get("mixed")) == [2, 4, 6]
    assert _rows(mixed / "checkpoint_metrics.jsonl") and {
        (r["step"], r["family"]) for r in _rows(mixed / "checkpoint_metrics.jsonl")
    } == set(trained)
    _assert_same_rows(_rows(mixed / "checkpoint_metrics.jsonl"), trained)
    for gen in sorted((run / "sce_generations").iterdir()):
        assert (mixed / "sce_generations" / gen.name).read_text() == gen.read_text(), gen.name
    assert json.loads((mixed / "selection.json").read_text()) == json.loads((run / "selection.json").read_text())


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_evaluate_under_ddp_and_fsdp_gives_the_single_process_rows(trajectory, tmp_path, strategy):
    """`evaluate` of the finished run as two DDP or FSDP2 processes (gloo, Lightning's own launcher, one
    `validate` per step in each): the rows of the in-training callbacks (≤ 1e-6), each once, and the same text."""
    import os
    import subprocess
    import sys

    run = trajectory / "npo" / "trajectory"
    copy = _unevaluated_copy(run, tmp_path / "run")
    if strategy == "ddp":
        words = ["--overrides", json.dumps(["--trainer.devices", "2", "--trainer.strategy", "ddp"])]
    else:
        words = ["-c", "trainer/fsdp_cpu.yaml"]  # a shipped config, by name
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    for key in ("LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_unlearn.cli", "evaluate", str(copy), *words],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = {"ddp": "DDPStrategy", "fsdp": "MaskedFSDPStrategy"}[strategy]
    assert f"evaluate: step 6 with {name} on 2 process(es)" in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert proc.stdout.count('"metrics_file"') == 1, proc.stdout[-3000:]  # the result, printed by rank 0 only
    trained = {(r["step"], r["family"]): r for r in _rows(run / "checkpoint_metrics.jsonl")}
    rows = _rows(copy / "checkpoint_metrics.jsonl")
    assert sorted((r["step"], r["family"]) for r in rows) == sorted(trained)
    _assert_same_rows(rows, trained)
    for gen in sorted((run / "sce_generations").iterdir()):
        assert (copy / "sce_generations" / gen.name).read_text() == gen.read_text(), gen.name


def test_the_shipped_lens_sweep_runs_both_methods_and_reports_them_by_panel(trajectory, tiny_dir, tmp_path):
    """sweeps/lens_smollm2.yaml with this narrative's trajectory config and the tiny model: one cell per method,
    then `report SWEEP_ROOT` draws them as the rows of this narrative's panel, with every row in rows.csv."""
    import shutil

    import yaml

    from lightning_unlearn.workflows.sweep import load_sweep, sweep_command

    spec = yaml.safe_load((config_root() / "sweeps" / "lens_smollm2.yaml").read_text(encoding="utf-8"))
    shutil.copy(trajectory / "npo.trajectory.yaml", trajectory / "trajectory.yaml")
    spec["root"] = str(tmp_path / "sweep")
    spec["grid"]["configs"] = [["lens/npo.yaml"], ["lens/tofu_ga.yaml"]]  # two cells are enough here (CI time)
    spec["cells"] = [{"configs": [str(trajectory / "trajectory.yaml")], "panel": "demo-en"}]
    model = str(tiny_dir)
    spec["overrides"].update({"model.init_args.model_path": model, "data.init_args.tokenizer_path": model,
                              "trainer.max_steps": 4})  # fmt: skip
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    result = sweep_command(path)
    assert sorted(c["label"] for c in result["cells"]) == ["npo", "tofu_ga"]
    for cell in load_sweep(path).cells:
        rows = _rows(cell.directory / "run" / "trajectory" / "checkpoint_metrics.jsonl")
        assert sorted((r["step"], r["family"]) for r in rows) == [
            (s, f) for s in (2, 4) for f in ("retain_drift", "sce")
        ]
    assert all(c["state"] == "done" for c in sweep_command(path)["cells"])  # a re-run trains nothing

    # A family added after training, fanned out over the executor: one `evaluate` per finished cell.
    eval_yaml = _heldout_eval_config(tmp_path, trajectory)
    spec["evaluate"] = {"configs": [str(eval_yaml)]}
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    before = {
        c.name: _rows(c.directory / "run" / "trajectory" / "checkpoint_metrics.jsonl") for c in load_sweep(path).cells
    }
    assert sorted(sweep_command(path, evaluate=True)["evaluated"]) == sorted(before)
    for cell in load_sweep(path).cells:
        rows = _rows(cell.directory / "run" / "trajectory" / "checkpoint_metrics.jsonl")
        assert sorted((r["step"], r["family"]) for r in rows) == [
            (s, f) for s in (2, 4) for f in ("retain_drift", "retain_drift:heldout", "sce")
        ]
        assert [r for r in rows if r["family"] != "retain_drift:heldout"] == before[cell.name]

    # The run's own evaluators fanned out per checkpoint (steps_per_job: 1) after its SCE rows and selection are
    # gone: 4 jobs, the same rows, each once, and each cell's selection made again from every row (the last short
    # job of each cell re-selects after its chunks).
    per_cell = {}
    for cell in load_sweep(path).cells:
        run = cell.directory / "run" / "trajectory"
        per_cell[cell.name] = (_rows(run / "checkpoint_metrics.jsonl"), (run / "selection.json").read_text())
        kept = [r for r in per_cell[cell.name][0] if r["family"] != "sce"]
        (run / "checkpoint_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
        (run / "selection.json").unlink()
    spec["evaluate"] = {"steps_per_job": 1}
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    assert sweep_command(path, evaluate=True)["jobs"] == 4
    for cell in load_sweep(path).cells:
        run = cell.directory / "run" / "trajectory"
        rows, want = _rows(run / "checkpoint_metrics.jsonl"), per_cell[cell.name][0]
        assert [(r["step"], r["family"]) for r in rows] == [(r["step"], r["family"]) for r in want]
        for got, expected in zip(rows, want, strict=True):
            a, b = _numbers(got), _numbers(expected)
            assert a.keys() == b.keys() and all(
                abs(a[k] - b[k]) <= 1e-6 for k in a if k not in ("/seconds", "/epoch")
            ), (got, [k for k in a if abs(a[k] - b[k]) > 1e-6])
        assert json.loads((run / "selection.json").read_text()) == json.loads(per_cell[cell.name][1])
        assert all((cell.directory / f"evaluate-steps={s}-{s}.log").exists() for s in (2, 4))

    report.main([spec["root"], "--out", str(tmp_path / "report")])
    out = tmp_path / "report"
    assert (out / "sce_heatmap-demo-en.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary) == ["demo-en / npo", "demo-en / tofu_ga"]
    assert {s["panel"] for s in summary.values()} == {"demo-en"}
    with open(out / "rows.csv", encoding="utf-8", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 12 and {r["label"] for r in table} == {"npo", "tofu_ga"}  # 2 cells × 2 steps × 3 families
    assert {"pooled/sce", "kl"} <= set(table[0])

    # TensorBoard across the cells: one HParams session each (the last selection's, after the evaluations above),
    # with the cell's overrides, label and panel beside the objective's arguments; no experiment summary anywhere.
    from tensorboard.backend.event_processing.event_accumulator import STORE_EVERYTHING_SIZE_GUIDANCE
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    multiplexer = EventMultiplexer(size_guidance=STORE_EVERYTHING_SIZE_GUIDANCE)
    multiplexer.AddRunsFromDirectory(spec["root"])
    multiplexer.Reload()
    content = multiplexer.PluginRunToTagToContent("hparams")
    cells = load_sweep(path).cells
    assert sorted(content) == sorted(f"{c.name}/run/trajectory/selection" for c in cells)
    objectives = {}
    for cell in cells:
        run = cell.directory / "run" / "trajectory"
        hparams, metrics = _session(run / "selection")
        assert set(SWEEP_HPARAMS) <= set(hparams), sorted(set(SWEEP_HPARAMS) - set(hparams))
        assert [hparams[f"sweep.{k}"] for k in ("cell", "label", "panel")] == [cell.name, cell.label, "demo-en"]
        assert hparams["trainer.max_steps"] == 4 and hparams["trainer.logger.init_args.save_dir"] == "{cell_dir}"
        assert json.loads(hparams["configs"]) == cell.configs
        _assert_session_matches(hparams, metrics, json.loads((run / "selection.json").read_text()))
        objectives[cell.label] = hparams["objective"]
        assert set(_events(run).Tags()["scalars"]) >= set(RUN_SCALARS) - {"train/loss"}  # 4 steps: no loss logged
    assert objectives == {"npo": "NPO", "tofu_ga": "GradientAscent"}


def test_rmu_runs_as_a_cell_of_the_lens_sweep_and_evaluate_reproduces_its_rows(trajectory, tiny_dir, tmp_path):
    """RMU through the sweep's cell configs (lens/rmu.yaml + the trajectory overlay; ℓ 2 of the tiny model's 4
    blocks): every checkpoint is scored in training, and `evaluate` on a copy without the rows gives the same rows
    from step 2's adapter directory and from step 4's checkpoint file (which carries RMU's control vector)."""
    from lightning_unlearn.workflows.evaluate import evaluate_command, saved_checkpoints

    model = str(tiny_dir)
    cli.main([
        "fit", "-c", "lens/rmu.yaml", "-c", str(trajectory / "npo.trajectory.yaml"),
        "--model.init_args.model_path", model, "--data.init_args.tokenizer_path", model,
        "--model.init_args.layer", "2", "--trainer.max_steps", "4",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
        "--trainer.logger.init_args.name", "rmu",
    ])  # fmt: skip
    run = tmp_path / "rmu" / "trajectory"
    trained = {(r["step"], r["family"]): r for r in _rows(run / "checkpoint_metrics.jsonl")}
    assert sorted(trained) == [(s, f) for s in (2, 4) for f in ("retain_drift", "sce")]
    assert trained[(2, "retain_drift")]["kl"] != trained[(4, "retain_drift")]["kl"]  # the adapter moved
    assert (run / "selection.json").exists()
    copy = _unevaluated_copy(run, tmp_path / "copy")
    assert {c.step: c.kind for c in saved_checkpoints(copy)} == {2: "adapter", 4: "checkpoint"}
    out = evaluate_command(copy)
    assert [e["step"] for e in out["evaluated"]] == [2, 4]
    rows = _rows(copy / "checkpoint_metrics.jsonl")
    assert sorted((r["step"], r["family"]) for r in rows) == sorted(trained)
    _assert_same_rows(rows, trained)


def test_attack_quantize_adds_one_row_per_step_to_a_finished_run_and_nothing_on_a_rerun(trajectory, tmp_path):
    """`attack quantize` on a copy of the finished LoRA run: the run's SCE and retain-drift evaluators again on the
    int4 model, one `quantization_attack` row per saved step; the run's own rows unchanged; a re-run adds nothing."""
    import shutil

    from lightning_unlearn.workflows.attack import main as attack_main

    run = tmp_path / "run"
    shutil.copytree(trajectory / "npo" / "trajectory", run)
    before = _rows(run / "checkpoint_metrics.jsonl")
    attack_main(["quantize", str(run), "--bits", "[4]", "--group_size", "16"])
    after = _rows(run / "checkpoint_metrics.jsonl")
    attacked = {r["step"]: r for r in after if r["family"] == "quantization_attack"}
    assert sorted(attacked) == sorted({r["step"] for r in before})
    assert [r for r in after if r["family"] != "quantization_attack"] == before
    for step, row in attacked.items():
        assert set(row["int4"]) >= {"sce", "retain_drift"}, step
        plain = next(r for r in before if r["step"] == step and r["family"] == "retain_drift")
        assert row["int4"]["retain_drift"]["ce"] != plain["ce"]  # the rounding changed the model
    attack_main(["quantize", str(run), "--bits", "[4]", "--group_size", "16"])
    assert _rows(run / "checkpoint_metrics.jsonl") == after


def test_attack_relearn_adds_a_recovery_curve_per_step_and_nothing_on_a_rerun(trajectory, tmp_path):
    """`attack relearn` on a copy of the finished LoRA run (under `evaluate`'s inference mode, where the relearning
    must still record gradients): one `relearning_attack` row per saved step with the evaluators after 1 and 2 steps;
    the run's own rows unchanged; a re-run adds nothing."""
    import shutil

    from lightning_unlearn.workflows.attack import main as attack_main

    run = tmp_path / "run"
    shutil.copytree(trajectory / "npo" / "trajectory", run)
    before = _rows(run / "checkpoint_metrics.jsonl")
    records = tmp_path / "related.jsonl"
    records.write_text(json.dumps({"prompt": "What is said about the alliance?", "answer": "It forced the war."})
                       + "\n", encoding="utf-8")  # fmt: skip
    argv = ["relearn", str(run), "--records", str(records), "--relearn_steps", "[1, 2]", "--lr", "1e-2"]
    attack_main(argv)
    after = _rows(run / "checkpoint_metrics.jsonl")
    curves = {r["step"]: r for r in after if r["family"] == "relearning_attack"}
    assert sorted(curves) == sorted({r["step"] for r in before})
    assert [r for r in after if r["family"] != "relearning_attack"] == before
    for step, row in curves.items():
        assert set(row) >= {"after_1", "after_2"} and row["records"] == 1
        plain = next(r for r in before if r["step"] == step and r["family"] == "retain_drift")
        assert row["after_2"]["retain_drift"]["ce"] != plain["ce"]  # the relearned adapter moved the model
    attack_main(argv)
    assert _rows(run / "checkpoint_metrics.jsonl") == after
    # the report draws before / after the attack and tabulates it at the selected checkpoint
    from lightning_unlearn.workflows.report import report_command

    report_command([str(run)], out=str(tmp_path / "report"))
    assert (tmp_path / "report" / "attacks.png").stat().st_size > 0
    table = (tmp_path / "report" / "attacks.md").read_text(encoding="utf-8")
    summary = json.loads((tmp_path / "report" / "summary.json").read_text(encoding="utf-8"))
    (selected,) = [s["suppression_tradeoff"]["step"] for s in summary.values()]
    assert f"step {selected} (the selected checkpoint)" in table
    lines = [line for line in table.splitlines() if line.startswith(("| full precision", "| relearn"))]
    assert [line.split(" | ")[0] for line in lines] == ["| full precision", "| relearn 1", "| relearn 2"]
    sce = next(r for r in before if r["step"] == selected and r["family"] == "sce")["pooled"]["sce"]
    assert lines[0].split(" | ")[1] == f"{sce:.3f}"


def test_attack_relearn_defaults_to_the_baseline_reproductions_outside_the_forget_sets_levels(tmp_path):
    from lightning_unlearn.workflows.attack import held_out_records

    baseline = tmp_path / "baseline.jsonl"
    rows = [("L0", "Reproduced"), ("L1", "Reproduced"), ("L1", "Not-reproduced"), ("L2", "Reproduced")]
    records = [{"id": f"{lv}/{i}", "level": lv, "label": label, "prompt": f"q{i}", "answer": f"a{i}"}
               for i, (lv, label) in enumerate(rows)]  # fmt: skip
    baseline.write_text("".join(json.dumps(r) + "\n" for r in records))
    forget = tmp_path / "forget.jsonl"
    forget.write_text(json.dumps({"prompt": "q0", "answer": "a0"}) + "\n")
    meta = {"kind": "lens-forget-set", "levels": ["L0"], "baseline": str(baseline)}
    (tmp_path / "forget.meta.json").write_text(json.dumps(meta))
    config = tmp_path / "config.yaml"
    config.write_text(f"data:\n  init_args:\n    forget_path: {forget}\n")
    assert [r["id"] for r in held_out_records(config)] == ["L1/1", "L2/3"]  # reproductions, not at L0
    (tmp_path / "forget.meta.json").write_text(json.dumps({**meta, "levels": ["L0", "L1", "L2"]}))
    with pytest.raises(ValueError, match="no reproduction outside the forget set's levels"):
        held_out_records(config)
    (tmp_path / "forget.meta.json").unlink()
    with pytest.raises(ValueError, match="not a LENS forget set with a baseline.*give --records FILE"):
        held_out_records(config)
