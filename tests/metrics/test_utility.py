import json

import pytest
import torch

from lightning_unlearn.data.collate import encode_prompt_answer, pad_batch
from lightning_unlearn.losses import sequence_logprobs
from lightning_unlearn.metrics.utility import (
    load_multiple_choice,
    mc_prompt,
    multiple_choice_accuracy,
    normalize_item,
    option_logprobs,
)


def test_accuracy_hand_computed():
    scores = [[-1.0, -0.5, -3.0], [-2.0, -2.0], [-0.1, -5.0]]
    # item 0 picks option 1, item 1 ties -> first option, item 2 picks option 0.
    assert multiple_choice_accuracy(scores, [1, 1, 0]) == pytest.approx(2 / 3)


def test_answer_forms_normalize(tmp_path):
    assert normalize_item({"question": "q", "choices": ["x", "y"], "answer": "B"})["answer"] == 1
    assert normalize_item({"question": "q", "choices": ["x", "y"], "answer": "y"})["answer"] == 1
    assert normalize_item({"question": "q", "choices": ["A", "y"], "answer": "A"})["answer"] == 0
    with pytest.raises(ValueError, match="out of range"):
        normalize_item({"question": "q", "choices": ["x", "y"], "answer": 2})
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps({"question": "q", "choices": ["x", "y"], "answer": 0}) + "\n\n")
    assert load_multiple_choice(path) == [{"question": "q", "choices": ["x", "y"], "answer": 0}]
    with pytest.raises(ValueError, match="missing field 'choices'"):
        path.write_text(json.dumps({"question": "q", "answer": 0}))
        load_multiple_choice(path)


def test_batched_option_scores_equal_one_at_a_time(tiny_model, tiny_tokenizer):
    items = [
        {"question": "Where was Alice Smith born?", "choices": ["Springfield", "Paris", "the lazy dog"], "answer": 0},
        {"question": "What is Python?", "choices": ["a programming language", "a fox"], "answer": 0},
    ]
    batched = option_logprobs(tiny_model, tiny_tokenizer, items, batch_size=5)
    q, c = items[0]["question"], items[0]["choices"][2]
    row = encode_prompt_answer(tiny_tokenizer, mc_prompt(q), f" {c}", 256)
    with torch.no_grad():
        batch = pad_batch([row], tiny_tokenizer.pad_token_id)
        logp, _ = sequence_logprobs(tiny_model(input_ids=batch["input_ids"]).logits, batch["labels"])
    assert batched[0][2] == pytest.approx(logp.item(), abs=1e-4)
    assert [len(s) for s in batched] == [3, 2]
