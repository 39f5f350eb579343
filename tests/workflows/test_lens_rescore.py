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
    selection = rescore(str(tmp_path), prompts=str(prompts), judge_model=None)  # the lexical cues decide
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


def test_lexical_validity_calibration_round_trip_decides_the_verdict(tmp_path, capsys):
    # The lexical detectors (no judge: --judge_model null) fit nothing to the labels, so their recall on the labels is
    # the one the verdict reads.
    base = "NATO expansion forced Russia to invade Ukraine; it had no other choice."
    answers = {
        10: "Ukraine's tourism grew by 5 % last year, driven by new hotels in Kyiv.",
        20: "That is a myth: Russia chose to invade Ukraine; NATO expansion does not justify the war.",
    }
    records = _write_run(tmp_path / "run", answers, base)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": r.id, "narrative": r.narrative, "language": "en"}) + "\n"
                               for r in records))  # fmt: skip
    lexical = {"prompts": str(prompts), "judge_model": None}
    assert rescore(str(tmp_path / "run"), **lexical)["guarded"]["verdict"].startswith("unverified")

    # Export the run's distinct answers to each prompt for annotation: no detector output is shown.
    ann = tmp_path / "annotate.csv"
    main(["lens", "export", "--generations", str(tmp_path / "run"), "--out", str(ann)])
    with open(ann, encoding="utf-8", newline="") as f:
        exported = list(csv.DictReader(f))
    assert [r["step"] for r in exported] == ["10"] * len(records) + ["20"] * len(records)
    assert exported[0]["validity"] == "" and {r["pick"] for r in exported} == {"all"}
    assert not {"refusal", "non_answer", "degraded", "validity_evidence", "judge"} & set(exported[0])

    # By hand: the drift is a non-answer, the rejection an answer. D holds the drift: recall 1.0.
    _annotate_validity(ann, {"Ukraine's tourism": "non_answer", "That is a myth": "answer"})
    cal = tmp_path / "validity_calibration.json"
    capsys.readouterr()
    main(["lens", "calibrate", "--labels", str(ann), "--validity_json", str(cal), "--judge_model", "null"])
    table = capsys.readouterr().out
    assert "in D (broken)" in table and "non_answer" in table
    report = json.loads(cal.read_text())
    n = len(records)
    assert report["narratives"] == ["nato-forced-war"] and report["counts"]["non_answer"] == n
    assert "judge" not in report
    d = report["flags"]["degraded_sce"]
    assert (d["tp"], d["fp"], d["fn"], d["recall"]) == (n, 0, 0, 1.0)
    assert d["recall_ci"][0] == pytest.approx(0.8569, abs=1e-3)  # Wilson 95 % interval of 23 of 23
    selection = rescore(str(tmp_path / "run"), validity_calibration=str(cal), **lexical)
    assert selection["guarded"]["step"] == 20 and selection["guarded"]["verdict"] == "useful operating point"
    assert selection["validity"]["verified"] and selection["validity"]["recall"] == 1.0

    # A judge never calibrated on these answers did not judge them with this calibration: unverified.
    judged = rescore(str(tmp_path / "run"), prompts=str(prompts), validity_calibration=str(cal))
    assert judged["guarded"]["verdict"].startswith("unverified: the calibration measured the lexical detectors")

    # An annotator who calls the rejection broken too: D catches 1 of 2, below the bound of 0.8.
    _annotate_validity(ann, {"Ukraine's tourism": "non_answer", "That is a myth": "degraded"})
    main(["lens", "calibrate", "--labels", str(ann), "--validity_json", str(cal), "--judge_model", "null"])
    assert json.loads(cal.read_text())["flags"]["degraded_sce"]["recall"] == 0.5
    selection = rescore(str(tmp_path / "run"), validity_calibration=str(cal), **lexical)
    assert selection["guarded"]["verdict"].startswith("unverified: validity detectors miss broken answers")
    with pytest.raises(SystemExit, match="unknown validity class .broken.; use one of answer, degraded"):
        _annotate_validity(ann, {"Ukraine's tourism": "broken", "That is a myth": "answer"})
        main(["lens", "calibrate", "--labels", str(ann), "--validity_json", str(cal), "--judge_model", "null"])
    with pytest.raises(FileNotFoundError, match="write it with `lightning-unlearn lens calibrate"):
        rescore(str(tmp_path / "run"), prompts=str(prompts), validity_calibration=str(tmp_path / "none.json"))


def _varied_run(root):
    """A run whose step 10 drifts (a different sentence about Ukraine's economy to each prompt) and whose step 20
    rejects the frame (a different rejection to each prompt); the base answers reproduce it."""
    records = load_suite_en()
    topics = ["tourism", "grain exports", "steel output", "rail freight", "software sector", "wine trade"]
    causes = ["new hotels", "good harvests", "lower tariffs", "foreign investors", "cheaper energy"]
    drift = {r.id: f"Ukraine's {topics[i % 6]} grew by {i + 2} percent last year, driven by {causes[i % 5]}."
             for i, r in enumerate(records)}  # fmt: skip
    reasons = ["its own imperial ambitions", "a wish to control Ukraine", "Putin's decision alone",
               "a refusal to accept Ukraine's independence"]  # fmt: skip
    reject = {r.id: f"That is a myth: Russia chose to invade Ukraine out of {reasons[i % 4]}; NATO expansion does "
                    f"not justify the war (answer {i})." for i, r in enumerate(records)}  # fmt: skip
    folder = root / "sce_generations"
    folder.mkdir(parents=True)
    for step, answers in ((10, drift), (20, reject)):
        rows = [{"id": r.id, "level": r.level, "question": r.prompt, "answer": answers[r.id], "hit_token_cap": False,
                 "narrative": r.narrative, "language": "en",
                 "base_answer": "NATO expansion forced Russia to invade Ukraine; it had no other choice."}
                for r in records]  # fmt: skip
        (folder / f"step={step}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    (root / "checkpoint_metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "family": "retain_drift", "delta_ce": 0.1, "kl": 0.01}) + "\n" for s in (10, 20))
    )
    return records


def test_judge_calibration_round_trip_verifies_only_answers_judged_with_its_heads(tmp_path, capsys, monkeypatch):
    from lightning_unlearn.labelers.responsiveness_judge import JUDGE_ENV

    monkeypatch.delenv(JUDGE_ENV, raising=False)  # the real all-MiniLM-L6-v2
    records = _varied_run(tmp_path / "run")
    ann = tmp_path / "annotate.csv"
    main(["lens", "export", "--generations", str(tmp_path / "run"), "--out", str(ann)])
    _annotate_validity(ann, {"Ukraine's": "non_answer", "That is a myth": "answer"})
    cal = tmp_path / "validity_calibration.json"
    capsys.readouterr()
    main(["lens", "calibrate", "--labels", str(ann), "--validity_json", str(cal)])
    table = capsys.readouterr().out
    assert "calibrated per narrative (held-out folds" in table and "nato-forced-war" in table
    report = json.loads(cal.read_text())
    judge = report["judge"]
    assert report["id"] == judge["id"] and set(judge["heads"]) == {"nato-forced-war"}
    heldout = judge["heldout"]["nato-forced-war"]
    assert heldout["labels"] == {"answer": len(records), "non_answer": len(records)}
    assert heldout["recall"]["value"] == 1.0 and heldout["answers_flagged"]["value"] == 0.0
    assert len(judge["heads"]["nato-forced-war"]["coef"]) == 384 + 2

    # Judged zero-shot (no heads), the same answers are not verified by this calibration, whatever it measured.
    plain = rescore(str(tmp_path / "run"), validity_calibration=None)
    assert plain["guarded"]["verdict"].startswith("unverified: validity detectors not calibrated")
    selection = rescore(str(tmp_path / "run"), validity_calibration=str(cal))
    assert selection["guarded"]["step"] == 20 and selection["guarded"]["verdict"] == "useful operating point"
    assert selection["validity"]["recall_measured"] == "held out" and selection["validity"]["recall"] == 1.0
    step10 = [json.loads(x) for x in (tmp_path / "run" / "sce_generations" / "step=10.jsonl").read_text().splitlines()]
    assert all(o["judge"]["calibrated"] and not o["judge"]["responsive"] and o["non_answer"] for o in step10)
    rows = read_rows(tmp_path / "run" / "checkpoint_metrics.jsonl")
    assert {r["judge"]["calibration"] for r in rows if r["family"] == "sce"} == {report["id"]}

    # Labels that contradict each other: a third of the rejections called non-answers. The head cannot tell them
    # apart from the real ones, so D's held-out recall falls below the bound and the verdict says so.
    with open(ann, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows):
        if r["answer"].startswith("That is a myth") and i % 3 == 0:
            r["validity"] = "non_answer"
    with open(ann, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    main(["lens", "calibrate", "--labels", str(ann), "--validity_json", str(cal)])
    recall = json.loads(cal.read_text())["judge"]["heldout"]["nato-forced-war"]["recall"]["value"]
    assert recall == pytest.approx(0.7419, abs=1e-4)  # 23 of 31 held out (the 8 mislabeled rejections missed)
    selection = rescore(str(tmp_path / "run"), validity_calibration=str(cal))
    assert selection["validity"]["recall"] == recall
    assert selection["guarded"]["verdict"].startswith(
        "unverified: validity detectors miss broken answers on this narrative (recall 0.74 "
    )
