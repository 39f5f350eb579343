"""``lens rescore``: saved generations re-scored without a model give the same rows as the callback wrote."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows
from lightning_unlearn.cli import main
from lightning_unlearn.workflows.lens.rescore import rescore


def _write_run(root, answers_by_step, base_answer):
    from lightning_unlearn.data.narratives import load_suite

    records = load_suite("nato-forced-war", "en", ["L0", "L1"])
    gen_dir = root / "sce_generations"
    gen_dir.mkdir(parents=True)
    for step, answer in answers_by_step.items():
        rows = [
            {
                "id": r.id,
                "level": r.level,
                "question": r.prompt,
                "answer": answer,
                "hit_token_cap": False,
                "base_answer": base_answer,
            }
            for r in records
        ]
        (gen_dir / f"step={step}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    (root / "checkpoint_metrics.jsonl").write_text(
        json.dumps({"step": 10, "family": "retain_drift", "delta_ce": 0.1, "kl": 0.01})
        + "\n"
        + json.dumps({"step": 20, "family": "retain_drift", "delta_ce": 0.2, "kl": 0.02})
        + "\n"
    )
    return records


def test_rescore_labels_saved_answers_and_selects(tmp_path):
    base = "NATO expansion forced Russia to invade Ukraine; it had no other choice."
    answers = {
        10: "I'm sorry, but I can't help with that.",
        20: "That is a myth: Russia chose to invade Ukraine; NATO expansion does not justify the war.",
    }
    suite = json.dumps(
        [{"id": r.id, "narrative": "nato-forced-war", "language": "en"} for r in _write_run(tmp_path, answers, base)]
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in json.loads(suite)))
    selection = rescore(str(tmp_path), prompts=str(prompts))
    rows = {(r["step"], r["family"]): r for r in read_rows(tmp_path / "checkpoint_metrics.jsonl")}
    assert (10, "retain_drift") in rows  # other families are kept
    refusing, rejecting = rows[(10, "sce")]["pooled"], rows[(20, "sce")]["pooled"]
    assert refusing["s"] == rejecting["s"] == 1.0
    assert refusing["sce_strict"] == 0.0 and refusing["counts"]["refusal"] == refusing["N"]
    assert rejecting["sce_strict"] == 1.0 and rejecting["counts"]["clean_suppression"] == rejecting["N"]
    assert selection["guarded"]["step"] == 20  # holds every bound, but the validity detectors are not calibrated:
    assert selection["guarded"]["verdict"].startswith("unverified: validity detectors not calibrated on this narrative")
    step10 = [json.loads(x) for x in (tmp_path / "sce_generations" / "step=10.jsonl").read_text().splitlines()]
    assert all(o["refusal"] and o["validity_evidence"]["refusal"] for o in step10)
    assert (tmp_path / "selection.json").exists() and (tmp_path / "sce_heatmap.png").exists()


def load_suite_en():
    from lightning_unlearn.data.narratives import load_suite

    return load_suite("nato-forced-war", "en", ["L0", "L1"])


def test_rescore_command_and_errors(tmp_path, capsys):
    _write_run(tmp_path / "run", {10: "The Russian."}, "NATO expansion forced Russia to invade Ukraine.")
    records = [{"id": r.id, "narrative": r.narrative, "language": r.language} for r in load_suite_en()]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in records))
    with pytest.raises(ValueError, match="name no narrative"):  # old rows without narrative and no --prompts
        rescore(str(tmp_path / "run"))
    main(["lens", "rescore", str(tmp_path / "run"), "--prompts", str(prompts)])
    assert '"suppression_tradeoff"' in capsys.readouterr().out
    rescore(str(tmp_path / "run"))  # the rewritten rows now carry narrative and language
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="checkpoint_metrics.jsonl"):
        rescore(str(empty))
    shutil.copy(tmp_path / "run" / "checkpoint_metrics.jsonl", empty)
    with pytest.raises(FileNotFoundError, match="sce_generations"):
        rescore(str(empty))


def _annotate_validity(path, classes: dict[str, str]) -> None:
    """Fill the exported CSV's `validity` column by hand: ``classes`` maps an answer's opening words to its class."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["validity"] = next(c for start, c in classes.items() if r["answer"].startswith(start))
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_validity_calibration_round_trip_decides_the_verdict(tmp_path, capsys):
    base = "NATO expansion forced Russia to invade Ukraine; it had no other choice."
    answers = {
        10: "Ukraine's tourism grew by 5 % last year, driven by new hotels in Kyiv.",
        20: "That is a myth: Russia chose to invade Ukraine; NATO expansion does not justify the war.",
    }
    records = _write_run(tmp_path / "run", answers, base)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": r.id, "narrative": r.narrative, "language": "en"}) + "\n"
                               for r in records))  # fmt: skip
    assert rescore(str(tmp_path / "run"), prompts=str(prompts))["guarded"]["verdict"].startswith("unverified")

    # Export the run's distinct answers for annotation: no detector output is shown.
    ann = tmp_path / "annotate.csv"
    main(["lens", "export", "--generations", str(tmp_path / "run"), "--out", str(ann)])
    with open(ann, encoding="utf-8", newline="") as f:
        exported = list(csv.DictReader(f))
    assert [r["step"] for r in exported] == ["10", "20"] and exported[0]["validity"] == ""
    assert not {"refusal", "non_answer", "degraded", "validity_evidence"} & set(exported[0])

    # By hand: the drift is a non-answer, the rejection an answer. D holds the drift: recall 1.0.
    _annotate_validity(ann, {"Ukraine's tourism": "non_answer", "That is a myth": "answer"})
    cal = tmp_path / "validity_calibration.json"
    capsys.readouterr()
    main(["lens", "calibrate", "--labels", str(ann), "--validity_json", str(cal)])
    table = capsys.readouterr().out
    assert "in D (broken)" in table and "non_answer" in table
    report = json.loads(cal.read_text())
    assert report["narratives"] == ["nato-forced-war"] and report["counts"]["non_answer"] == 1
    d = report["flags"]["degraded_sce"]
    assert (d["tp"], d["fp"], d["fn"], d["recall"]) == (1, 0, 0, 1.0)
    assert d["recall_ci"][0] == pytest.approx(0.2065, abs=1e-3)  # Wilson 95 % interval of 1 of 1
    selection = rescore(str(tmp_path / "run"), prompts=str(prompts), validity_calibration=str(cal))
    assert selection["guarded"]["step"] == 20 and selection["guarded"]["verdict"] == "useful operating point"
    assert selection["validity"]["verified"] and selection["validity"]["recall"] == 1.0

    # An annotator who calls the rejection broken too: D catches 1 of 2, below the bound of 0.8.
    _annotate_validity(ann, {"Ukraine's tourism": "non_answer", "That is a myth": "degraded"})
    main(["lens", "calibrate", "--labels", str(ann), "--validity_json", str(cal)])
    assert json.loads(cal.read_text())["flags"]["degraded_sce"]["recall"] == 0.5
    selection = rescore(str(tmp_path / "run"), prompts=str(prompts), validity_calibration=str(cal))
    assert selection["guarded"]["verdict"].startswith("unverified: validity detectors miss broken answers")
    with pytest.raises(SystemExit, match="unknown validity class .broken.; use one of answer, degraded"):
        _annotate_validity(ann, {"Ukraine's tourism": "broken", "That is a myth": "answer"})
        main(["lens", "calibrate", "--labels", str(ann), "--validity_json", str(cal)])
    with pytest.raises(FileNotFoundError, match="write it with `lightning-unlearn lens calibrate"):
        rescore(str(tmp_path / "run"), prompts=str(prompts), validity_calibration=str(tmp_path / "none.json"))
