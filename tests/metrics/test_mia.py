import math
import zlib
from types import SimpleNamespace

import pytest
import torch

from lightning_unlearn.losses import IGNORE_INDEX
from lightning_unlearn.metrics.mia import (
    gradnorm_scores,
    loss_scores,
    mia_auc,
    min_k_plus_plus_scores,
    min_k_scores,
    privleak,
    reference_scores,
    zlib_scores,
)

I = IGNORE_INDEX  # noqa: E741


def _batch(target_probs):
    """One sample whose answer tokens (all token 1 of a 2-token vocabulary) get the given probabilities.

    Position 0 is the prompt; logits at t predict labels[t + 1].
    """
    n = len(target_probs)
    logits = torch.zeros(1, n + 1, 2)
    for t, q in enumerate(target_probs):
        logits[0, t] = torch.tensor([math.log(1 - q), math.log(q)])
    labels = torch.tensor([[I] + [1] * n])
    return logits, labels


def test_loss_and_zlib_scores_by_hand():
    logits, labels = _batch([0.5, 0.25, 0.8])
    loss = -(math.log(0.5) + math.log(0.25) + math.log(0.8)) / 3
    assert loss_scores(logits, labels).item() == pytest.approx(loss, rel=1e-6)
    # zlib of "abcabc": the 2-byte header, 8 bytes of deflate data and the 4-byte Adler-32 checksum.
    assert len(zlib.compress(b"abcabc")) == 14
    assert zlib_scores(logits, labels, ["abcabc"]).item() == pytest.approx(loss / 14, rel=1e-6)


def test_reference_score_is_the_loss_difference():
    logits, labels = _batch([0.5, 0.5])
    ref_logits, _ = _batch([0.25, 0.25])
    # log 2 - log 4 = -log 2: the model finds the sample likelier than the reference does.
    assert reference_scores(logits, ref_logits, labels).item() == pytest.approx(-math.log(2), rel=1e-6)


def test_min_k_takes_the_lowest_fraction_without_the_eos():
    logits, labels = _batch([0.9, 0.1, 0.5, 0.2, 0.8, 0.01])
    # The last answer token (0.01, the EOS) is left out: 5 tokens, k = 0.4 -> int(2.0) = 2 lowest: 0.1 and 0.2.
    expected = -(math.log(0.1) + math.log(0.2)) / 2
    assert min_k_scores(logits, labels, k=0.4).item() == pytest.approx(expected, rel=1e-6)
    # With the EOS: 6 tokens, int(2.4) = 2 lowest: 0.01 and 0.1.
    with_eos = -(math.log(0.01) + math.log(0.1)) / 2
    assert min_k_scores(logits, labels, k=0.4, include_eos=True).item() == pytest.approx(with_eos, rel=1e-6)
    # At least one token: k = 0.1 of 5 rounds down to 0 and is raised to 1.
    assert min_k_scores(logits, labels, k=0.1).item() == pytest.approx(-math.log(0.1), rel=1e-6)


def test_min_k_plus_plus_standardises_by_the_models_own_distribution():
    # 3-token vocabulary. Position 1: p = (0.7, 0.2, 0.1), target 1; position 2: p = (0.5, 0.25, 0.25), target 0;
    # position 3 predicts the EOS (left out).
    p1, p2 = [0.7, 0.2, 0.1], [0.5, 0.25, 0.25]
    logits = torch.tensor([[[0.0, 0.0, 0.0], p1, p2, [1 / 3] * 3, [1 / 3] * 3]]).log()
    labels = torch.tensor([[I, I, 1, 0, 2]])

    def z(p, target):
        mu = sum(q * math.log(q) for q in p)  # E[log p]
        var = sum(q * math.log(q) ** 2 for q in p) - mu**2  # Var[log p]
        return (math.log(p[target]) - mu) / math.sqrt(var)

    z1, z2 = z(p1, 1), z(p2, 0)
    # Position 1: mu = .7 ln .7 + .2 ln .2 + .1 ln .1 = -0.80182, E[ln^2] = 1.13730, var = 0.49439, sd 0.70313,
    # z1 = (ln .2 + 0.80182) / 0.70313 = -1.14862. Position 2: log p = (-L, -2L, -2L), L = ln 2, mu = -1.5 L,
    # deviations +-0.5 L, sd 0.5 L, z2 = 0.5 L / 0.5 L = 1.
    assert z1 == pytest.approx(-1.14862, abs=1e-5) and z2 == pytest.approx(1.0, rel=1e-12)
    # k = 0.5 of 2 tokens -> the lowest one; k = 1 -> both.
    assert min_k_plus_plus_scores(logits, labels, k=0.5).item() == pytest.approx(-z1, rel=1e-5)
    assert min_k_plus_plus_scores(logits, labels, k=1.0).item() == pytest.approx(-(z1 + z2) / 2, rel=1e-5)
    # The EOS position is uniform: variance 0, clamped at 1e-6, and z = 0 there.
    assert min_k_plus_plus_scores(logits, labels, k=1.0, include_eos=True).item() == pytest.approx(
        -(z1 + z2 + 0.0) / 3, rel=1e-4
    )


class _BigramLM(torch.nn.Module):
    """logits[t] = W[input_ids[t]] + b; a frozen extra tensor that GradNorm must ignore."""

    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(torch.zeros(3, 3))
        self.b = torch.nn.Parameter(torch.zeros(3))
        self.frozen = torch.nn.Parameter(torch.ones(3), requires_grad=False)

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.W[input_ids] + self.b + 0 * self.frozen)


def test_gradnorm_mean_of_per_tensor_norms_by_hand():
    model = _BigramLM()
    input_ids = torch.tensor([[0, 1, 2]])
    labels = torch.tensor([[I, 1, 2]])
    # W = 0, b = 0: every prediction is uniform. With the EOS, n = 2 positions (inputs 0 and 1 predict 1 and 2):
    # dL/dW[0] = ((1/3, 1/3, 1/3) - e1) / 2 = (1/6, -1/3, 1/6); dL/dW[1] = (1/6, 1/6, -1/3); dL/db = their sum.
    norm_w = math.sqrt(2 * (1 / 36 + 1 / 9 + 1 / 36))
    norm_b = math.sqrt(1 / 9 + 1 / 36 + 1 / 36)
    got = gradnorm_scores(model, input_ids, labels, include_eos=True)
    assert got.item() == pytest.approx((norm_w + norm_b) / 2, rel=1e-6)
    # Without the EOS only position 0 counts: dL/dW[0] = dL/db = (1/3, -2/3, 1/3), norm sqrt(2/3) each.
    assert gradnorm_scores(model, input_ids, labels).item() == pytest.approx(math.sqrt(2 / 3), rel=1e-6)
    # The 1-norm of the same gradients: 4/3 each.
    assert gradnorm_scores(model, input_ids, labels, p=1).item() == pytest.approx(4 / 3, rel=1e-6)
    assert model.W.grad is None  # the caller's .grad is left alone


def test_mia_auc_in_ous_orientation():
    # Members (loss-like scores) 0.1, 0.4; non-members 0.3, 0.5. Pairs where the non-member scores higher:
    # (0.3 > 0.1), (0.5 > 0.1), (0.5 > 0.4) = 3 of 4.
    assert mia_auc([0.1, 0.4], [0.3, 0.5]) == pytest.approx(0.75)
    assert mia_auc([0.1, 0.2], [0.3, 0.5]) == 1.0
    with pytest.raises(ValueError, match="0 non-member"):
        mia_auc([0.1], [])


def test_privleak_muse_orientation_reproduces_ous_formula():
    auc_model, auc_ref = 0.9, 0.5
    # MUSE's orientation (OU's privleak): 1 - AUC in, (0.1 - 0.5) / 0.5 * 100 = -80: the model still leaks.
    assert privleak(auc_model, auc_ref) == pytest.approx(-80.0)
    ou = ((1 - auc_model) - (1 - auc_ref)) / ((1 - auc_ref) + 1e-10) * 100
    assert privleak(auc_model, auc_ref) == pytest.approx(ou, rel=1e-9)
    # The formula on the AUCs as given: (0.9 - 0.5) / 0.5 * 100 = +80.
    assert privleak(auc_model, auc_ref, orientation="membership") == pytest.approx(80.0)
    with pytest.raises(ValueError, match="zero denominator"):
        privleak(0.7, 1.0)


def test_gradnorm_works_under_inference_mode():
    # Lightning's validate runs callbacks under torch.inference_mode().
    input_ids, labels = torch.tensor([[0, 1, 2]]), torch.tensor([[I, 1, 2]])
    with torch.inference_mode():
        got = gradnorm_scores(_BigramLM(), input_ids.clone(), labels.clone())
    assert got.item() == pytest.approx(math.sqrt(2 / 3), rel=1e-6)
