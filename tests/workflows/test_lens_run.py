"""``lens run``: from a suite file written in an empty folder outside the repository to a report, with the tiny model
and the session's tiny judge; outputs named by the narrative id; a bad suite or method refused before any work."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest
import yaml
from test_lens_own_suite import SUITE

from lightning_unlearn.data.narratives import load_suite
from lightning_unlearn.workflows.lens import main as lens_main


@pytest.mark.slow
def test_a_suite_file_of_ones_own_runs_to_a_report(tiny_dir, tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.chdir(tmp_path)  # an empty folder outside the repository
    Path("orchard-drought.json").write_text(json.dumps(SUITE), encoding="utf-8")
    # A random model reproduces no narrative, so the weak labeler would keep no forget row: label the base L0
    # answers Target-Dominant by hand (the strict forget set of the same command).
    with open("labels.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "label"])
        writer.writerows([r.id, "Target-Dominant"] for r in load_suite("orchard-drought.json", "en", ["L0"]))
    with caplog.at_level(logging.INFO, logger="lightning_unlearn"):
        lens_main(["run", "orchard-drought.json", "--model", str(tiny_dir), "--labels", "labels.csv", "--max_steps",
                   "2", "--every", "1", "--max_new_tokens", "4", "--methods", "[npo]"])  # fmt: skip
    printed = capsys.readouterr().out
    # the sweep cell's progress lines, read from its fit.log as it trains, are in the command's own log
    progress = [r.getMessage() for r in caplog.records if ": fit: " in r.getMessage()]
    assert progress[0].startswith("sweep: cell npo-orchard-drought-en-") and progress[0].endswith(
        "training from step 0 to 2"
    )
    assert any(m.endswith("fit: step 2/2 (100 %)") or " · done" in m for m in progress[1:])
    data, sweep = tmp_path / "runs/lens/smollm2/orchard-drought-en", tmp_path / "runs/lens/smollm2/sweep"
    assert {p.name for p in data.iterdir()} >= {"baseline.jsonl", "forget_strict.jsonl", "retain.jsonl",
                                                "trajectory.yaml"}  # fmt: skip
    (cell,) = [p for p in sweep.iterdir() if p.name.startswith("npo-orchard-drought-en-")]
    run = cell / "run" / "trajectory"
    rows = [json.loads(x) for x in (run / "checkpoint_metrics.jsonl").read_text().splitlines()]
    sce = [r for r in rows if r["family"] == "sce"]
    assert [r["step"] for r in sce] == [1, 2]
    # the trajectory judged its answers with the judge, and recorded where the suite lives
    assert all(r["judge"]["calibration"] is None and r["suites_dir"] == str(tmp_path) for r in sce)
    answers = [json.loads(x) for x in (run / "sce_generations" / "step=2.jsonl").read_text().splitlines()]
    assert len(answers) == 5 and all(a["judge"] is not None and a["narrative"] == "orchard-drought" for a in answers)
    assert (run / "selection.json").is_file() and (sweep / "report" / "sce_heatmap-orchard-drought-en.png").is_file()
    assert "orchard-drought-en / npo" in printed and "validity detectors: unverified" in printed
    trajectory = yaml.safe_load((data / "trajectory.yaml").read_text())
    sce_args = next(c["init_args"] for c in trajectory["trainer"]["callbacks"] if "SCEEvaluation" in c["class_path"])
    assert sce_args["judge"]["init_args"]["model"] == "all-MiniLM-L6-v2" and sce_args["max_new_tokens"] == 4
    # the labeler's suite was found from the run's rows alone: export proposes answers to label from it
    lens_main(["export", "--generations", str(run), "--sample", "2", "--out", "annotate.csv"])
    with open("annotate.csv", encoding="utf-8", newline="") as f:
        picked = list(csv.DictReader(f))
    assert len(picked) == 2 and {r["pick"] for r in picked} == {"near", "random"}
    assert all(float(r["weight"]) >= 1 for r in picked)


def test_a_bad_suite_or_method_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = json.dumps(SUITE, indent=1).replace('"L0": [', '"L0": ["Why?"],\n "L0": [', 1)
    Path("orchard-drought.json").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match="key 'L0' is given twice"):
        lens_main(["run", "orchard-drought.json", "--model", "/nowhere"])
    Path("orchard-drought.json").write_text(json.dumps(SUITE), encoding="utf-8")
    with pytest.raises(ValueError, match="unknown method 'nope': there is no shipped config lens/nope.yaml"):
        lens_main(["run", "orchard-drought.json", "--methods", "[nope]"])
    with pytest.raises(ValueError, match="method 'dpo' cannot run on a weak-label forget set"):
        lens_main(["run", "orchard-drought.json", "--methods", "[dpo]"])
    with pytest.raises(ValueError, match="every=20 > max_steps=10"):
        lens_main(["run", "orchard-drought.json", "--max_steps", "10", "--every", "20"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["orchard-drought.json"]  # nothing written
