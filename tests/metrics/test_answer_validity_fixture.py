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
    # Measured: accuracy 0.922; precision 1.0 for degraded, refusal, echo and non-answer; recall 1.0 / 1.0 / 0.83 /
    # 0.85; "fine" 0.74 precision (five off-point but fluent non-answers pass as answers). The floors keep a margin.
    assert result["accuracy"] >= 0.9
    for flag in ("degraded", "refusal", "echo", "non_answer"):
        assert per[flag]["precision"] >= 0.9, (flag, per[flag])
    assert per["degraded"]["recall"] >= 0.95 and per["refusal"]["recall"] >= 0.75
    assert per["non_answer"]["recall"] >= 0.8 and per["fine"]["recall"] >= 0.9
