"""Selection rule, heatmap and the ``lightning-unlearn report`` command on hand-made metric files."""

from __future__ import annotations

import json

import pytest

from lightning_unlearn.callbacks.checkpoint_metrics_file import flatten_metrics, merge_rows, read_rows
from lightning_unlearn.cli import EXTRA_COMMANDS, main
from lightning_unlearn.metrics.selection import sce_table, select_checkpoints
from lightning_unlearn.workflows import report


def _row(step, sce, g, family="sce"):
    cell = {"sce": sce, "s": 1.0, "g": g}
    return {"step": step, "family": family, "levels": {"L0": cell, "L1": cell, "L2": cell, "L3": cell}, "pooled": cell}


def test_selection_picks_max_sce_and_first_collapse():
    points = [
        {"step": 10, "sce": 0.2, "g": 0.0},
        {"step": 20, "sce": 0.6, "g": 0.2},
        {"step": 30, "sce": 0.6, "g": 0.5},
        {"step": 40, "sce": 0.1, "g": 0.9},
    ]
    sel = select_checkpoints(points, collapse_boundary=0.5)
    tradeoff = sel["suppression_tradeoff"]
    assert {k: tradeoff[k] for k in ("step", "sce", "g")} == {"step": 20, "sce": 0.6, "g": 0.2}  # tie -> earlier
    assert sel["first_collapse"] == {"step": 30, "g": 0.5}
    assert select_checkpoints(points, collapse_boundary=0.95)["first_collapse"] is None
    with pytest.raises(ValueError, match="collapse_boundary"):
        select_checkpoints(points, collapse_boundary=0)


def test_merge_rows_replaces_by_step_and_family(tmp_path):
    path = tmp_path / "m.jsonl"
    merge_rows(path, [_row(10, 0.1, 0.0), {"step": 10, "family": "utility", "accuracy": 0.5}])
    merge_rows(path, [_row(10, 0.3, 0.0), _row(20, float("nan"), 0.0)])
    rows = read_rows(path)
    assert [(r["step"], r["family"]) for r in rows] == [(10, "sce"), (10, "utility"), (20, "sce")]
    assert rows[0]["pooled"]["sce"] == 0.3 and rows[2]["pooled"]["sce"] is None  # NaN is written as null
    assert not list(tmp_path.glob(".*tmp"))
    assert flatten_metrics({"a": {"b": 1, "c": True, "d": None}, "e": 2.5}) == {"a/b": 1.0, "e": 2.5}
    assert set(sce_table(rows)) == {"L0", "L1", "L2", "L3", "pooled"}


def test_report_command_builds_heatmap_and_summary(tmp_path, capsys):
    assert EXTRA_COMMANDS["report"][0] == "lightning_unlearn.workflows.report:main"
    runs = {"ga": [(10, 0.2, 0.1), (20, 0.5, 0.3), (30, 0.1, 0.8)], "npo": [(10, 0.4, 0.0), (20, 0.3, 0.1)]}
    for name, points in runs.items():
        # Two logger versions of one run: the report merges them.
        merge_rows(tmp_path / name / "version_0" / "checkpoint_metrics.jsonl", [_row(*points[0])])
        merge_rows(tmp_path / name / "version_1" / "checkpoint_metrics.jsonl", [_row(*p) for p in points[1:]])
    # GA's selected step (20) saved its answers; NPO's (10) did not.
    gen = {"level": "L0", "base_reproduced": True, "reproduced": False, "degraded": False, "health": {},
           "clean_suppression": False, "non_answer": True}  # fmt: skip
    generations = [
        {
            **gen,
            "id": "q1",
            "base_answer": "NATO forced the war.",
            "answer": "Tourism grew | by 5 %.",
            "validity_evidence": {"non_answer": "no claim word"},
        },
        {
            **gen,
            "id": "q2",
            "base_answer": "NATO expanded east.",
            "answer": "No, that is not true.",
            "non_answer": False,
            "clean_suppression": True,
        },
        {**gen, "id": "q3", "level": "L1", "base_answer": "x", "answer": "y"},
    ]
    gen_file = tmp_path / "ga" / "version_1" / "sce_generations" / "step=20.jsonl"
    gen_file.parent.mkdir(parents=True)
    gen_file.write_text("".join(json.dumps(r) + "\n" for r in generations))
    out = tmp_path / "report"
    main(["report", str(tmp_path / "ga"), str(tmp_path / "npo"), "--out", str(out), "--collapse_boundary", "0.5"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ga"]["suppression_tradeoff"]["step"] == 20 and summary["ga"]["first_collapse"]["step"] == 30
    assert summary["npo"]["suppression_tradeoff"]["step"] == 10 and summary["npo"]["first_collapse"] is None
    assert summary["ga"]["num_checkpoints"] == 3
    assert (out / "sce_heatmap.png").read_bytes()[:4] == b"\x89PNG"
    # The selected checkpoint's L0 answers beside the base answers, with their classes (L1 rows left out).
    assert [(a["id"], a["outcome"]) for a in summary["ga"]["answers"]] == [
        ("q1", "non-answer: no claim word"), ("q2", "clean suppression")]  # fmt: skip
    assert summary["npo"]["answers"] == []
    answers = (out / "answers.md").read_text()
    assert "| q1 | NATO forced the war. | Tourism grew \\| by 5 %. | non-answer: no claim word |" in answers
    assert "q3" not in answers and "## npo: L0 answers at step 10" in answers and "no saved generations" in answers
    printed = capsys.readouterr().out
    assert "| ga | 3 | 20 | 0.500 |" in printed
    with pytest.raises(FileNotFoundError, match="no checkpoint_metrics.jsonl"):
        report.main([str(out), "--out", str(tmp_path / "x")])  # lightning-unlearn report makes it one line


def _tofu_rows():
    # step: (forget_quality, model_utility, retain ΔCE); ½(FQ + MU) = 0.35, 0.55, 0.60, 0.45
    numbers = {10: (0.1, 0.6, 0.0), 20: (0.4, 0.7, 0.1), 30: (0.7, 0.5, 0.9), 40: (0.5, 0.4, 0.2)}
    rows = []
    for step, (fq, mu, dce) in numbers.items():
        rows.append({"step": step, "family": "tofu", "forget_quality": fq, "model_utility": mu, "retain": {"prob": mu}})
        rows.append({"step": step, "family": "retain_drift", "delta_ce": dce, "kl": 0.0})
    rows.append({"step": 50, "family": "tofu", "model_utility": 0.9})  # no forget quality: not a candidate
    return rows


def test_selection_on_a_declared_combination_of_row_values_with_the_retain_guard():
    from lightning_unlearn.metrics.selection import OperatingPointGuards, select_on_score

    half = {"tofu/forget_quality": 0.5, "tofu/model_utility": 0.5}
    sel = select_on_score(_tofu_rows(), half)
    # ½(0.7 + 0.5) = 0.60 at step 30 is the best; its retain ΔCE 0.9 breaks the 0.5-nat bound, so the guarded pick is
    # step 20, ½(0.4 + 0.7) = 0.55
    assert sel["best"]["step"] == 30 and sel["best"]["score"] == pytest.approx(0.5 * 0.7 + 0.5 * 0.5)
    assert sel["best"]["verdict"].startswith("apparent forgetting: retain drift (ΔCE)")
    assert sel["guarded"]["step"] == 20 and sel["guarded"]["score"] == pytest.approx(0.55)
    assert sel["skipped_steps"] == [50] and sel["num_checkpoints"] == 4
    unbounded = OperatingPointGuards(max_retain_delta_ce=None)
    assert select_on_score(_tofu_rows(), half, guards=unbounded)["guarded"]["step"] == 30
    # a nested value, minimised: the lowest retain Prob is step 40's 0.4
    assert select_on_score(_tofu_rows(), {"tofu/retain/prob": 1.0}, mode="min")["best"]["step"] == 40
    assert select_on_score(_tofu_rows(), {"mia/loss/auc": 1.0}) is None  # no such rows
    for bad, match in (({}, "mapping of row values"), ({"forget_quality": 1}, "<family>/<path>"),
                       ({"tofu/x": "half"}, "finite numbers")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            select_on_score(_tofu_rows(), bad)


def test_checkpoint_selection_writes_the_score_pick_for_a_run_without_sce_rows(tmp_path):
    from types import SimpleNamespace

    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard_events import session

    from lightning_unlearn.callbacks import CheckpointSelection

    merge_rows(tmp_path / "checkpoint_metrics.jsonl", _tofu_rows())
    callback = CheckpointSelection(
        output_dir=str(tmp_path),
        score={"tofu/forget_quality": 0.5, "tofu/model_utility": 0.5},
        run_hparams={"note": "tofu", "grid": {"seed": 1}},
    )
    logger = TensorBoardLogger(tmp_path, name="tb", version=0, default_hp_metric=False)
    trainer = SimpleNamespace(loggers=[logger], logger=logger)
    callback.setup(trainer, None, "fit")
    callback.on_checkpoint_evaluated(trainer, {"family": "tofu", "step": 50})
    written = json.loads((tmp_path / "selection.json").read_text())
    assert written["score"]["best"]["step"] == 30 and written["score"]["guarded"]["step"] == 20
    assert "suppression_tradeoff" not in written and not (tmp_path / "sce_heatmap.png").exists()

    class TofuRun:  # what the HParams session reads of a LightningModule: its class and hparams
        hparams = {"lr": 1.0e-5, "optim": {"betas": [0.9, 0.999]}, "adapter": None, "_instantiator": "x"}

    callback.log_session(trainer, TofuRun())
    callback.log_session(trainer, TofuRun())  # a later selection replaces the session: TensorBoard reads the first
    logger.finalize("success")
    hparams, metrics = session(tmp_path / "tb" / "version_0" / "selection")
    assert hparams == {"objective": "TofuRun", "model.init_args.lr": 1.0e-5,
                       "model.init_args.optim.betas": "[0.9, 0.999]", "note": "tofu", "grid.seed": 1,
                       "verdict": "apparent forgetting", "failed_guards": "max_retain_delta_ce",
                       "guarded_verdict": "useful operating point"}  # fmt: skip
    assert metrics == pytest.approx({"score/selected": 0.6, "score/selected_step": 30, "score/guarded_step": 20,
                                     "hp_metric": 0.6})  # fmt: skip
    with pytest.raises(ValueError, match="score_mode='best'"):
        CheckpointSelection(score={"tofu/forget_quality": 1.0}, score_mode="best")
