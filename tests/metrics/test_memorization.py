import math

import pytest
import torch

from lightning_unlearn.losses import IGNORE_INDEX
from lightning_unlearn.metrics.memorization import extracted, extraction_rate, memorization_scores


def _hand_batch():
    # One sample, T=5: prompt tokens at 0-1, answer tokens 2, 1, 3 at positions 2-4.
    # Logits at positions 1, 2, 3 predict them; probabilities chosen so the answer-token probs are 0.7, 0.2, 0.7
    # and the argmax is right, wrong (0), right.
    probs = torch.tensor(
        [
            [0.25, 0.25, 0.25, 0.25],
            [0.1, 0.1, 0.7, 0.1],
            [0.5, 0.2, 0.2, 0.1],
            [0.1, 0.1, 0.1, 0.7],
            [0.25, 0.25, 0.25, 0.25],
        ]
    )
    logits = probs.log().unsqueeze(0)
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 2, 1, 3]])
    return logits, labels


def test_prob_em_es_hand_computed():
    logits, labels = _hand_batch()
    m = memorization_scores(logits, labels, include_eos=True)
    assert m["prob"].item() == pytest.approx((0.7 * 0.2 * 0.7) ** (1 / 3), rel=1e-5)
    assert m["em"].item() == pytest.approx(2 / 3)
    # The last wrong answer token is the 2nd (index 1), so k = 2 and ES = 1 - 2/3.
    assert m["es"].item() == pytest.approx(1 / 3)
    assert m["num_tokens"].item() == 3


def test_batched_with_padding_and_perfect_recall():
    logits, labels = _hand_batch()
    perfect = torch.full((1, 5, 4), -10.0)
    for t, tok in ((1, 2), (2, 1), (3, 3)):
        perfect[0, t, tok] = 10.0
    # Second sample right-padded by one extra position.
    pad = torch.zeros(1, 1, 4)
    batch_logits = torch.cat([torch.cat([logits, pad], 1), torch.cat([perfect, pad], 1)])
    batch_labels = torch.cat([torch.cat([labels, torch.tensor([[IGNORE_INDEX]])], 1)] * 2)
    m = memorization_scores(batch_logits, batch_labels, include_eos=True)
    assert m["em"].tolist() == pytest.approx([2 / 3, 1.0])
    assert m["es"].tolist() == pytest.approx([1 / 3, 1.0])
    assert m["prob"][1].item() == pytest.approx(math.exp(-3 * math.log1p(3 * math.exp(-20)) / 3), rel=1e-6)


def test_all_wrong_gives_zero_es_and_empty_answer_raises():
    logits = torch.zeros(1, 3, 4)
    logits[0, :, 0] = 5.0
    labels = torch.tensor([[IGNORE_INDEX, 1, 2]])
    m = memorization_scores(logits, labels)
    assert m["em"].item() == 0.0 and m["es"].item() == 0.0
    with pytest.raises(ValueError, match="no answer tokens"):
        memorization_scores(logits, torch.full((1, 3), IGNORE_INDEX))


def test_extraction():
    answers = ["Her email is Alice.Smith@Example.com.", "I do not know.", "born in  Springfield"]
    targets = ["alice.smith@example.com", "555-0142", "Born in Springfield"]
    assert extracted(answers, targets) == [True, False, True]
    assert extraction_rate(answers, targets) == pytest.approx(2 / 3)


def test_openunlearning_convention_leaves_out_the_final_eos():
    # Answer tokens 2, 1, 3 with 3 the EOS; EM/ES score 2 and 1 only (right, wrong): EM = 1/2, and the last
    # scored token is wrong, so k = n = 2 and ES = 1 - 2/2 = 0. Prob keeps all three tokens.
    logits, labels = _hand_batch()
    m = memorization_scores(logits, labels)
    assert m["em"].item() == pytest.approx(1 / 2)
    assert m["es"].item() == pytest.approx(0.0)
    assert m["num_tokens"].item() == 2
    assert m["prob"].item() == pytest.approx((0.7 * 0.2 * 0.7) ** (1 / 3), rel=1e-5)


def test_whole_string_without_its_eos_is_memorized_by_default_only():
    # The model predicts the PII tokens 2 and 1 but not the EOS (3): OpenUnlearning's EM = ES = 1;
    # with the EOS scored, EM = 2/3 and ES = 1 - 3/3 = 0.
    logits = torch.full((1, 5, 4), -5.0)
    for t, tok in ((1, 2), (2, 1), (3, 0)):
        logits[0, t, tok] = 5.0
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 2, 1, 3]])
    ou = memorization_scores(logits, labels)
    assert ou["em"].item() == 1.0 and ou["es"].item() == 1.0
    full = memorization_scores(logits, labels, include_eos=True)
    assert full["em"].item() == pytest.approx(2 / 3) and full["es"].item() == 0.0
    with pytest.raises(ValueError, match="only one token"):
        memorization_scores(logits, torch.tensor([[IGNORE_INDEX] * 4 + [3]]))
