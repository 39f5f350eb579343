import math

import pytest
import torch

from lightning_unlearn.losses import IGNORE_INDEX
from lightning_unlearn.metrics.retain_drift import finalize_retain_drift, retain_drift_sums


def test_ce_ppl_delta_and_kl_hand_computed():
    # T=2, V=2: position 0 predicts the single answer token (label 1) at position 1.
    model_probs = torch.tensor([[[0.25, 0.75], [0.5, 0.5]]])
    base_probs = torch.tensor([[[0.5, 0.5], [0.9, 0.1]]])
    labels = torch.tensor([[IGNORE_INDEX, 1]])
    sums = retain_drift_sums(model_probs.log(), labels, base_probs.log())
    out = finalize_retain_drift(sums)
    assert out["ce"] == pytest.approx(-math.log(0.75))
    assert out["ppl"] == pytest.approx(1 / 0.75)
    assert out["base_ce"] == pytest.approx(-math.log(0.5))
    assert out["delta_ce"] == pytest.approx(-math.log(0.75) + math.log(0.5))
    # KL(p_base || p_θ) over the full vocabulary at the one answer position; the last position is not scored.
    assert out["kl"] == pytest.approx(0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75))


def test_sums_add_across_batches_and_stored_base_ce():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 11, generator=g)
    base = torch.randn(4, 6, 11, generator=g)
    labels = torch.randint(0, 11, (4, 6), generator=g)
    labels[:, :2] = IGNORE_INDEX
    whole = retain_drift_sums(logits, labels, base)
    halves = [retain_drift_sums(logits[i : i + 2], labels[i : i + 2], base[i : i + 2]) for i in (0, 2)]
    summed = {k: halves[0][k] + halves[1][k] for k in whole}
    for k in whole:
        assert summed[k] == pytest.approx(whole[k], rel=1e-5)
    assert whole["kl_sum"] > 0 and whole["num_tokens"] == 16
    only_model = finalize_retain_drift(retain_drift_sums(logits, labels), base_ce=1.0)
    assert only_model["delta_ce"] == pytest.approx(only_model["ce"] - 1.0)
    assert "kl" not in only_model
    with pytest.raises(ValueError, match="zero answer tokens"):
        finalize_retain_drift({"ce_sum": 0.0, "num_tokens": 0.0})
