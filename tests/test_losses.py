"""Loss functions against values worked out by hand from the papers' formulas."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_unlearn.losses import (
    IGNORE_INDEX,
    ga_loss,
    ga_retain_loss,
    gd_loss,
    kl_divergence,
    nll_loss,
    normalized_nll,
    npo_loss,
    sequence_logprobs,
    simnpo_loss,
    weighted_nll_loss,
)

T = torch.tensor


def test_npo_at_reference_is_two_over_beta_log_two():
    logps = T([-3.0, -7.5, -0.2])
    for beta in (0.1, 1.0, 4.0):
        assert npo_loss(logps, logps.clone(), beta).item() == pytest.approx(2 / beta * math.log(2), rel=1e-6)


def test_npo_fixed_numbers():
    # log-ratios [1, -1], beta 0.5: -(2/0.5) * mean(log σ(-0.5), log σ(0.5)) = 4 * (0.974077 + 0.474077) / 2
    loss = npo_loss(T([-2.0, -4.0]), T([-3.0, -3.0]), beta=0.5)
    assert loss.item() == pytest.approx(2.896308, abs=1e-5)


def test_npo_stays_finite_far_from_reference():
    assert torch.isfinite(npo_loss(T([1e4]), T([0.0]), beta=0.1))
    with pytest.raises(ValueError, match="beta"):
        npo_loss(T([0.0]), T([0.0]), beta=0.0)


def test_simnpo_fixed_numbers_delta_outside_beta():
    # beta 2, delta 1: rewards (β/|y|)·logπ = [-4, -2]; log σ(4-1)=-0.048587, log σ(2-1)=-0.313262; -(2/2)·mean
    loss = simnpo_loss(T([-6.0, -2.0]), T([3, 2]), beta=2.0, delta=1.0)
    assert loss.item() == pytest.approx(0.180924, abs=1e-5)
    # With delta inside beta it would be -mean(log σ(2), log σ(0)) = (0.126928 + 0.693147) / 2 = 0.410038.
    assert abs(loss.item() - 0.410038) > 0.1


def test_simnpo_matches_formula_on_random_values():
    logps, lengths, beta, delta = -torch.rand(5, dtype=torch.float64) * 3, torch.randint(1, 9, (5,)), 10.0, 1.5
    expected = -(2 / beta) * torch.log(torch.sigmoid(-(beta / lengths) * logps - delta)).mean()
    assert simnpo_loss(logps, lengths, beta, delta).item() == pytest.approx(expected.item(), rel=1e-5)


def test_ga_gd_and_normalized_nll():
    f_logps, f_len = T([-6.0, -2.0]), T([3, 2])  # NLL̄ = [2, 1]
    assert normalized_nll(f_logps, f_len).tolist() == pytest.approx([2.0, 1.0])
    assert nll_loss(f_logps, f_len).item() == pytest.approx(1.5)
    assert ga_loss(f_logps, f_len).item() == pytest.approx(-1.5)
    # γ=2, α=0.5, retain NLL̄ = 1/4: 2·(-1.5) + 0.5·0.25
    assert gd_loss(f_logps, f_len, T([-1.0]), T([4]), gamma=2.0, alpha=0.5).item() == pytest.approx(-2.875)
    assert normalized_nll(T([0.0]), T([0])).item() == 0.0  # no answer tokens: 0, not nan


def test_ga_retain_and_weighted_nll():
    f_logps, f_len = T([-6.0, -2.0]), T([3, 2])
    # 0.5·(-1.5) + 1·(8/2) + 1·0.3
    loss = ga_retain_loss(f_logps, f_len, T([-8.0]), T([2]), T(0.3), 0.5, 1.0, 1.0)
    assert loss.item() == pytest.approx(3.55)
    # MemFlex: -0.6·1.5 + 2.0·0.25
    assert weighted_nll_loss(f_logps, f_len, T([-1.0]), T([4]), -0.6, 2.0).item() == pytest.approx(-0.4)


def test_kl_two_token_toy():
    # Answer positions t=0 (p_θ=[.5,.5], p_ref=[.75,.25]) and t=1 (identical); t=2 predicts nothing.
    labels = T([[IGNORE_INDEX, 0, 1]])
    policy = T([[[0.0, 0.0], [1.0, 2.0], [5.0, 0.0]]])
    reference = T([[[math.log(3.0), 0.0], [1.0, 2.0], [0.0, 5.0]]])
    expected = (0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)) / 2
    assert kl_divergence(policy, reference, labels).item() == pytest.approx(expected, abs=1e-6)
    assert kl_divergence(policy, policy, labels).item() == pytest.approx(0.0, abs=1e-7)
    # Prompt positions do not count.
    assert kl_divergence(policy, reference, T([[IGNORE_INDEX, IGNORE_INDEX, 1]])).item() == pytest.approx(0, abs=1e-7)


def test_sequence_logprobs_masks_prompt_and_padding():
    logits = torch.zeros(1, 4, 4)  # uniform: every answer token has log-prob -log 4
    logps, lengths = sequence_logprobs(logits, T([[IGNORE_INDEX, 2, 3, IGNORE_INDEX]]))
    assert lengths.tolist() == [2]
    assert logps.item() == pytest.approx(-2 * math.log(4))


# --- conventions: the OpenUnlearning-equivalent settings, against hand-computed OpenUnlearning values ---------------


def test_token_average_batch_is_openunlearning_ga_and_gd():
    # Answer NLL sums 6 (3 tokens) and 3 (1 token): per sequence mean(6/3, 3/1) = 2.5; per token of the batch
    # (HF's loss over the batch's answer tokens, as OpenUnlearning's GA/GD) (6 + 3) / (3 + 1) = 2.25.
    logps, lengths = T([-6.0, -3.0]), T([3, 1])
    assert ga_loss(logps, lengths).item() == pytest.approx(-2.5)
    assert ga_loss(logps, lengths, "batch").item() == pytest.approx(-2.25)
    r_logps, r_lengths = T([-1.0, -4.0]), T([2, 2])  # retain: sequence mean(0.5, 2) = 1.25; batch 5/4 = 1.25
    assert gd_loss(logps, lengths, r_logps, r_lengths, 2.0, 0.5, "batch").item() == pytest.approx(
        2.0 * -2.25 + 0.5 * 1.25
    )
    with pytest.raises(ValueError, match="token_average"):
        nll_loss(logps, lengths, "token")


def test_kl_over_all_positions_is_openunlearning_batchmean():
    # B=1, T=2, V=2. Position 0: p_ref = (0.5, 0.5), p_θ = (0.25, 0.75); position 1: p_ref = p_θ = (0.9, 0.1).
    # Labels make only position 0 predict an answer token (labels[1] is the answer).
    # OU: kl_div(log p_θ, log p_ref, log_target=True, reduction="batchmean") over the 2 flattened positions
    #   = (KL_0 + 0) / 2, KL_0 = 0.5·ln(0.5/0.25) + 0.5·ln(0.5/0.75) = 0.5·ln 2 + 0.5·ln(2/3) = 0.143841.
    ref = torch.log(T([[[0.5, 0.5], [0.9, 0.1]]]))
    pol = torch.log(T([[[0.25, 0.75], [0.9, 0.1]]]))
    labels = T([[IGNORE_INDEX, 1]])
    kl0 = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    assert kl_divergence(pol, ref, labels).item() == pytest.approx(kl0, rel=1e-5)
    assert kl_divergence(pol, ref, labels, positions="all").item() == pytest.approx(kl0 / 2, rel=1e-5)
    # With padding at position 1 left out by the attention mask, only position 0 counts.
    assert kl_divergence(pol, ref, labels, "all", T([[1, 0]])).item() == pytest.approx(kl0, rel=1e-5)
    with pytest.raises(ValueError, match="positions"):
        kl_divergence(pol, ref, labels, positions="prompt")


def test_simnpo_delta_is_beta_times_openunlearnings_delta():
    # OU: L = −(2/β)·mean log σ(β·(NLL/|y| − δ_OU)). One answer, log π = −6 over |y| = 4, β 10, δ_OU 1.5:
    #   β·(1.5 − 1.5) = 0 → L = −(2/10)·log σ(0) = 0.2·ln 2 = 0.138629.
    # Here δ sits outside β: the same value needs δ = β·δ_OU = 15.
    logps, lengths = T([-6.0]), T([4])
    assert simnpo_loss(logps, lengths, beta=10.0, delta=15.0).item() == pytest.approx(0.2 * math.log(2), rel=1e-6)
    # With the paper's δ 1.5 the margin is far smaller: −(2/10)·log σ(15 − 1.5).
    assert simnpo_loss(logps, lengths, beta=10.0, delta=1.5).item() == pytest.approx(
        -0.2 * math.log(1 / (1 + math.exp(-13.5))), rel=1e-6
    )
