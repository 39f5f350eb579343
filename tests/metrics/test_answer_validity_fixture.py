"""The detectors against 77 real SmolLM2 post-unlearning answers labeled by hand (tests/fixtures/)."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("answer_validity_benchmark", ROOT / "benchmarks" / "answer_validity.py")
benchmark = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(benchmark)


def _rows() -> list[dict]:
    return [json.loads(x) for x in benchmark.FIXTURE.read_text(encoding="utf-8").splitlines() if x.strip()]


def test_fixture_is_real_labeled_answers():
    rows = _rows()
    assert len(rows) >= 60
    assert set(Counter(r["label"] for r in rows)) == {"degraded", "refusal", "echo", "non_answer", "fine"}
    assert all(r["source"].split("/")[0] in ("lr2e-4", "lr5e-5") and r["answer"] for r in rows)
    assert len({r["answer"] for r in rows}) == len(rows)


def test_detectors_precision_and_recall_on_the_fixture():
    result = benchmark.scores(_rows())
    per = result["per_class"]
    # Measured (in-sample: the cues, and the NATO claim vocabulary, were written with these answers at hand):
    # accuracy 0.909; broken answers in D 0.959 (47 of 49; 0.898 before responsiveness); real answers flagged 0.111
    # (2 of 18; 0.0 before); precision 1.0 for degraded, refusal and echo, 0.865 for non-answer; recall 0.87, 1.0,
    # 0.83, 0.94. Two hand-labeled "degraded" answers (Russian gibberish to English questions) are detected as wrong
    # language (non-answer): in D either way.
    assert result["accuracy"] >= 0.88
    assert result["broken_in_d"] >= 0.93 and result["fine_flagged"] <= 0.12
    for flag in ("degraded", "refusal", "echo"):
        assert per[flag]["precision"] >= 0.9, (flag, per[flag])
    assert per["non_answer"]["precision"] >= 0.85
    assert per["degraded"]["recall"] >= 0.8 and per["refusal"]["recall"] >= 0.75
    assert per["non_answer"]["recall"] >= 0.9 and per["fine"]["recall"] >= 0.85


def test_detectors_on_held_out_taiwan_answers():
    # 62 distinct L0–L2 answers of the us-abandons-taiwan NPO trajectory (steps 10 and 20), labeled by hand before
    # any detector output on them was read; no cue, claim word or threshold was fitted on them. Measured: broken
    # answers in D 24 of 40 (0.60) with the lexical detectors, 28 of 40 (0.70) with the base model's NLL at the bound
    # fitted on NATO; real answers flagged 5 of 21 (0.24) either way. Short of the goal (0.85 / 0.10): the verdict
    # stays "unverified" until a calibration on the narrative shows recall above the bound.
    path = benchmark.FIXTURE.with_name("lens_smollm2_labeled_taiwan.jsonl")
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    assert len(rows) >= 60 and len({r["answer"] for r in rows}) == len(rows)
    assert all(r["source"].startswith("lr2e-4/npo/step=") and r["base_nll"] > 0 for r in rows)
    lexical, with_nll = benchmark.scores(rows), benchmark.scores(rows, benchmark.MAX_BASE_NLL)
    assert lexical["broken_in_d"] >= 0.55 and with_nll["broken_in_d"] >= 0.65
    assert lexical["fine_flagged"] <= 0.3 and with_nll["fine_flagged"] <= 0.3
    assert with_nll["per_class"]["degraded"]["recall"] == 1.0


def test_detectors_on_the_third_narrative_used_only_for_the_final_report():
    # 90 distinct L0–L2 answers of the sanctions-backfire NPO trajectory (steps 10–30), labeled by hand before any
    # detector output on them was read; the narrative's suite was written before any of its answers existed, and
    # nothing is fitted on it. Measured: broken answers in D 35 of 64 (0.55) with the base NLL judged at the NATO
    # bound, 13 of 64 (0.20) without it; real answers flagged 6 of 26 (0.23) and 2 of 26 (0.08).
    path = benchmark.FIXTURE.with_name("lens_smollm2_labeled_sanctions.jsonl")
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    assert len(rows) >= 60 and len({r["answer"] for r in rows}) == len(rows)
    assert {r["id"].split("/")[0] for r in rows} == {"sanctions-backfire"}
    lexical, with_nll = benchmark.scores(rows), benchmark.scores(rows, benchmark.MAX_BASE_NLL)
    assert with_nll["broken_in_d"] >= 0.5 and lexical["broken_in_d"] >= 0.15
    assert with_nll["fine_flagged"] <= 0.3 and lexical["fine_flagged"] <= 0.12


def _fixture(name: str) -> list[dict]:
    path = benchmark.FIXTURE.with_name(name)
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def test_health_flags_tell_the_cap_from_breakage_across_narratives():
    # The cap flag alone would degrade mostly real and off-topic answers on the narratives its thresholds were not
    # set on; the health decision flags every hand-degraded Taiwan answer and no real one. Measured: `unfinished`
    # precision for degraded 0.917 on NATO (in-sample), 3/15 = 0.2 on Taiwan, 1/86 on sanctions; `degraded`
    # 13/13 precise with recall 13/15 on NATO, 3/3 and 3/3 on Taiwan.
    nato, taiwan, sanctions = (benchmark.health_flags(_fixture(f"lens_smollm2_labeled{s}.jsonl"))
                               for s in ("", "_taiwan", "_sanctions"))  # fmt: skip
    assert taiwan["unfinished"]["precision"]["value"] <= 0.25 and sanctions["unfinished"]["precision"]["value"] < 0.05
    assert sanctions["unfinished"]["by_hand_class"]["fine"] >= 20  # verbose real answers the cap cuts
    for flags in (nato, taiwan):
        assert flags["degraded"]["precision"]["value"] == 1.0 and flags["degraded"]["by_hand_class"]["fine"] == 0
    assert nato["degraded"]["recall"]["hits"] == 13 and nato["degraded"]["recall"]["of"] == 15
    low, high = nato["degraded"]["recall"]["wilson95"]
    assert low < 13 / 15 < high


def test_fit_bound_is_the_smallest_bound_flagging_at_most_a_tenth_of_real_answers():
    rows = [{"label": "fine", "base_nll": v} for v in (0.5, 1.0, 1.2, 1.3, 1.5, 1.6, 1.7, 1.8, 1.9, 2.5, 3.0)]
    rows.append({"label": "non_answer", "base_nll": 9.0})
    # 11 real answers: one may be flagged (int(1.1) = 1), so the bound sits just above the second largest, 2.5.
    assert benchmark.fit_bound(rows) == 2.51
    assert benchmark.fit_bound(rows[:10]) == 1.91  # 10 real answers: one flagged (the 2.5)
