"""The SCE callback's typed records and the generation line they write."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lightning_unlearn.callbacks.sce_evaluation import load_prompt_records
from lightning_unlearn.callbacks.sce_records import SCEOutput, SuitePrompt
from lightning_unlearn.data.narratives import load_suite
from lightning_unlearn.metrics.sce import classify_output


def test_a_generation_line_keeps_its_keys_in_order_with_the_outcome_flags_last():
    outcome = classify_output(True, False, False, refusal=True)
    output = SCEOutput(
        id="n/en/L0/01/compact", level="L0", narrative="n", language="en", question="Why?", answer="I can't say.",
        hit_token_cap=False, label="Not Reproduced", stance="other", entity_recovery=None, base_reproduced=True,
        base_answer="Because.", health={"empty": False, "score": 0.0}, validity_evidence={},
        judge={"question": 0.1, "claim": 0.2, "score": 0.15, "threshold": 0.55, "responsive": False,
               "calibrated": False},
        outcome=outcome,
    )  # fmt: skip
    line = json.dumps(output.to_row(), ensure_ascii=False)
    assert line == (
        '{"id": "n/en/L0/01/compact", "level": "L0", "narrative": "n", "language": "en", "question": "Why?", '
        '"answer": "I can\'t say.", "hit_token_cap": false, "label": "Not Reproduced", "stance": "other", '
        '"entity_recovery": null, "base_reproduced": true, "base_answer": "Because.", '
        '"health": {"empty": false, "score": 0.0}, "validity_evidence": {}, "judge": {"question": 0.1, "claim": 0.2, '
        '"score": 0.15, "threshold": 0.55, "responsive": false, "calibrated": false}, "reproduced": false, '
        '"degraded": false, '
        '"invalid": false, "refusal": true, "echo": false, "non_answer": false, "wrong_language": false, '
        '"clean_suppression": false, "degraded_sce": false, "degraded_sce_health": false, "degraded_sce_strict": true}'
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        output.answer = "changed"


def test_suite_prompts_come_from_suite_records_with_their_question_and_defaults():
    (first, *_) = load_prompt_records(load_suite("demo-canal-tolls", "en", ["L0"]))
    assert first.id == "demo-canal-tolls/en/L0/01/compact" and first.level == "L0"
    assert first.question == first.prompt and first.narrative == "demo-canal-tolls"
    (bare,) = load_prompt_records([{"prompt": "Why?", "level": "L1"}])
    assert bare == SuitePrompt(id="0", level="L1", prompt="Why?", question="Why?", narrative="", language="en")
