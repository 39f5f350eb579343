"""Loss functions against values worked out by hand from the papers' formulas."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_unlearn.losses import (
    IGNORE_INDEX,
    answer_token_logprobs,
    dpo_loss,
    ga_loss,
    ga_retain_loss,
    gd_loss,
    idk_nll_loss,
    kl_divergence,
    nll_loss,
    normalized_nll,
    npo_loss,
    rmu_control_vector,
    rmu_forget_loss,
    rmu_positions,
    rmu_retain_loss,
    satimp_loss,
    sequence_kl,
    sequence_logprobs,
    simnpo_loss,
    undial_loss,
    weighted_nll_loss,
    wga_loss,
)

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)

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


def test_sequence_kl_is_the_per_row_mean_over_answer_positions():
    # Row 0: answer positions t=0 (p_θ=[.5,.5], p_ref=[.75,.25]) and t=1 (identical) -> half the first KL.
    # Row 1: one answer position, t=1 (p_θ=[.5,.5], p_ref=[.25,.75]) -> that KL alone; padding after it ignored.
    labels = T([[IGNORE_INDEX, 0, 1], [IGNORE_INDEX, IGNORE_INDEX, 1]])
    policy = T([[[0.0, 0.0], [1.0, 2.0], [5.0, 0.0]], [[3.0, 0.0], [0.0, 0.0], [0.0, 9.0]]])
    reference = T([[[math.log(3.0), 0.0], [1.0, 2.0], [0.0, 5.0]], [[0.0, 0.0], [0.0, math.log(3.0)], [0.0, 0.0]]])
    kl = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    per_row = sequence_kl(policy, reference, labels)
    assert per_row.tolist() == pytest.approx([kl / 2, kl], abs=1e-6)
    # log-probabilities as the reference give the same values
    assert sequence_kl(policy, reference.log_softmax(-1), labels).tolist() == pytest.approx([kl / 2, kl], abs=1e-6)
    # the batch-averaged kl_divergence weighs positions, not rows: (kl + 0 + kl) / 3
    assert kl_divergence(policy, reference, labels).item() == pytest.approx(2 * kl / 3, abs=1e-6)
    assert sequence_kl(policy, reference, T([[IGNORE_INDEX] * 3] * 2)).tolist() == [0.0, 0.0]


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


# --- issue 32: IdkNLL, DPO, UNDIAL, WGA, SatImp: hand-worked values, then OpenUnlearning's formulas inline --------


def test_idk_nll_fixed_numbers():
    # idk answers: NLL sums 4 over 2 tokens, 1 over 1 → NLL̄ [2, 1], mean 1.5; retain 3 over 3 → 1. γ 2, α 0.5:
    # 2·1.5 + 0.5·1 = 3.5. Per token of the batch: idk (4 + 1)/3 = 5/3 → 2·5/3 + 0.5·1 = 3.8333.
    idk, idk_len, ret, ret_len = T([-4.0, -1.0]), T([2, 1]), T([-3.0]), T([3])
    assert idk_nll_loss(idk, idk_len, ret, ret_len, 2.0, 0.5).item() == pytest.approx(3.5)
    assert idk_nll_loss(idk, idk_len, ret, ret_len, 2.0, 0.5, "batch").item() == pytest.approx(2 * 5 / 3 + 0.5)


def test_dpo_fixed_numbers_and_scales():
    # Row 0: chosen log-ratio −2 − (−3) = 1, rejected −3 − (−3) = 0 → margin 1; row 1: −5 − (−4) = −1 and
    # −1 − (−2) = 1 → margin −2. β 0.5: −mean(log σ(0.5), log σ(−1)) = (0.474077 + 1.313262)/2 = 0.893670.
    args = T([-2.0, -5.0]), T([-3.0, -1.0]), T([-3.0, -4.0]), T([-3.0, -2.0])
    assert dpo_loss(*args, beta=0.5).item() == pytest.approx(0.893670, abs=1e-6)
    assert dpo_loss(*args, beta=0.5, scale="two_over_beta").item() == pytest.approx(4 * 0.893670, abs=1e-5)
    same = T([-3.0, -7.0])
    assert dpo_loss(same, same, same, same, beta=0.1).item() == pytest.approx(math.log(2), rel=1e-6)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(same, same, same, same, beta=0.0)
    with pytest.raises(ValueError, match="scale"):
        dpo_loss(same, same, same, same, scale="ou")


def _undial_batch():
    """V = 3. Row 0 answers at positions 0 and 1 (labels[1:] = [1, 1]); row 1 only at position 1 (its position 0 is
    prompt and carries logits that would change the value if it counted). Teacher logits are 0 everywhere."""
    ln2 = math.log(2)
    policy = T([[[ln2, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [[5.0, -5.0, 0.0], [0.0, 0.0, 0.0], [0.0] * 3]])
    labels = T([[IGNORE_INDEX, 1, 1], [IGNORE_INDEX, IGNORE_INDEX, 1]])
    return policy, torch.zeros_like(policy), labels


def test_undial_fixed_numbers():
    # strength ln 4: adjusted teacher (0, −ln 4, 0) → q = (1, 1/4, 1)/(9/4) = (4/9, 1/9, 4/9).
    # Policy (ln 2, 0, 0) → p = (1/2, 1/4, 1/4): H(q, p) = 4/9·ln 2 + 1/9·ln 4 + 4/9·ln 4 = 14/9·ln 2 = 1.078227.
    # Policy (0, 0, 0) → p uniform: H(q, p) = ln 3 = 1.098612.
    # Per sequence: mean((1.078227 + 1.098612)/2, 1.098612) = 1.093516; per token: (1.078227 + 2·1.098612)/3.
    policy, teacher, labels = _undial_batch()
    h0, h1 = 14 / 9 * math.log(2), math.log(3)
    assert undial_loss(policy, teacher, labels, math.log(4)).item() == pytest.approx(((h0 + h1) / 2 + h1) / 2, rel=1e-6)
    assert undial_loss(policy, teacher, labels, math.log(4), "batch").item() == pytest.approx(
        (h0 + 2 * h1) / 3, rel=1e-6
    )
    # strength 0 on the teacher's own logits: the loss is the teacher's entropy, ln 3 at a uniform teacher.
    assert undial_loss(teacher, teacher, labels, 0.0).item() == pytest.approx(math.log(3), rel=1e-6)


def test_undial_gradient_vanishes_at_the_adjusted_teacher():
    # H(q, p_θ) is smallest at p_θ = q: with the policy's logits = the adjusted teacher's, the gradient is 0.
    teacher = torch.randn(2, 4, 6)
    labels = T([[IGNORE_INDEX, 2, 3, 0], [IGNORE_INDEX, IGNORE_INDEX, 5, 1]])
    adjusted = teacher.clone()
    for b, t in [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2)]:
        adjusted[b, t, labels[b, t + 1]] -= 3.0
    policy = adjusted.clone().requires_grad_(True)
    undial_loss(policy, teacher, labels, 3.0).backward()
    assert policy.grad.abs().max().item() < 1e-6


def _token_batch():
    """Token log-probs: row 0 answers with p = 0.5 and 0.25, row 1 with p = 0.8 (its second slot is padding)."""
    token_logps = torch.log(T([[0.5, 0.25], [0.8, 1.0]]))
    return token_logps.clone().requires_grad_(True), T([[True, True], [True, False]])


def test_wga_fixed_numbers_and_gradient():
    # β 1: w = p, terms w·log p: 0.5·ln 0.5, 0.25·ln 0.25 | 0.8·ln 0.8.
    logps, mask = _token_batch()
    a, b, c = 0.5 * math.log(0.5), 0.25 * math.log(0.25), 0.8 * math.log(0.8)
    assert wga_loss(logps, mask, beta=1.0).item() == pytest.approx(((a + b) / 2 + c) / 2, rel=1e-6)
    assert wga_loss(logps, mask, 1.0, "batch").item() == pytest.approx((a + b + c) / 3, rel=1e-6)
    # The weights are constants: ∂L/∂log p_t = w_t / |y_i| / B (per sequence) = [[0.5/4, 0.25/4], [0.8/2, 0]].
    wga_loss(logps, mask, beta=1.0).backward()
    assert torch.allclose(logps.grad, T([[0.125, 0.0625], [0.4, 0.0]]))
    # β 0 is plain GA on the answer tokens: mean log p.
    plain = ((math.log(0.5) + math.log(0.25)) / 2 + math.log(0.8)) / 2
    assert wga_loss(logps, mask, beta=0.0).item() == pytest.approx(plain, rel=1e-6)


def test_satimp_fixed_numbers_and_gradient():
    # β1 1, β2 1: w = p(1 − p) = 0.25, 0.1875 | 0.16. β1 5, β2 1 (OU's defaults): w = p^5 (1 − p).
    logps, mask = _token_batch()
    a, b, c = 0.25 * math.log(0.5), 0.1875 * math.log(0.25), 0.16 * math.log(0.8)
    assert satimp_loss(logps, mask, 1.0, 1.0).item() == pytest.approx(((a + b) / 2 + c) / 2, rel=1e-6)
    assert satimp_loss(logps, mask, 1.0, 1.0, "batch").item() == pytest.approx((a + b + c) / 3, rel=1e-6)
    a5, b5, c5 = 0.5**6 * math.log(0.5), 0.25**5 * 0.75 * math.log(0.25), 0.8**5 * 0.2 * math.log(0.8)
    assert satimp_loss(logps, mask).item() == pytest.approx(((a5 + b5) / 2 + c5) / 2, rel=1e-6)
    satimp_loss(logps, mask, 1.0, 1.0, "batch").backward()
    assert torch.allclose(logps.grad, T([[0.25 / 3, 0.1875 / 3], [0.16 / 3, 0.0]]))


def _random_lm_batch(seed: int, prompt_lengths=(2, 3), lengths=(6, 4), vocab: int = 11):
    """Random logits and HF labels: row i has prompt_lengths[i] prompt tokens and is right-padded to 6."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(lengths), 6, vocab, generator=g, dtype=torch.float64)
    ids = torch.randint(0, vocab, (len(lengths), 6), generator=g)
    labels = ids.clone()
    for i, (p, n) in enumerate(zip(prompt_lengths, lengths)):
        labels[i, :p] = IGNORE_INDEX
        labels[i, n:] = IGNORE_INDEX
    return logits, labels


def _ou_token_ce(logits, labels):
    """OpenUnlearning's per-token CE (``nn.CrossEntropyLoss(ignore_index=-100, reduction="none")`` on the flattened
    shifted logits), and its valid-token mask."""
    shift_logits, shift_labels = logits[..., :-1, :], labels[..., 1:]
    ce = torch.nn.CrossEntropyLoss(ignore_index=-100, reduction="none")(
        shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1)
    )
    return ce, shift_labels.reshape(-1) != -100


def test_dpo_with_two_over_beta_is_openunlearnings_compute_dpo_loss():
    # OU: compute_batch_nll = per-sequence SUM of CE over valid tokens; win/lose log-ratio = −(nll − nll_ref);
    # loss = −2/β·mean logsigmoid(β·(win − lose)).
    win, win_labels = _random_lm_batch(1)
    lose, lose_labels = _random_lm_batch(2)
    win_ref, lose_ref = _random_lm_batch(3)[0], _random_lm_batch(4)[0]

    def ou_nll(logits, labels):
        ce = torch.nn.CrossEntropyLoss(ignore_index=-100, reduction="none")
        return ce(logits[..., :-1, :].transpose(-1, -2), labels[..., 1:]).sum(-1)

    beta = 0.1
    win_ratio = -(ou_nll(win, win_labels) - ou_nll(win_ref, win_labels))
    lose_ratio = -(ou_nll(lose, lose_labels) - ou_nll(lose_ref, lose_labels))
    ou = -2 / beta * torch.nn.functional.logsigmoid(beta * (win_ratio - lose_ratio)).mean()
    ours = dpo_loss(
        sequence_logprobs(win, win_labels)[0],
        sequence_logprobs(lose, lose_labels)[0],
        sequence_logprobs(win_ref, win_labels)[0],
        sequence_logprobs(lose_ref, lose_labels)[0],
        beta,
        "two_over_beta",
    )
    assert ours.item() == pytest.approx(ou.item(), rel=1e-6)


def test_idk_nll_batch_average_is_the_hf_loss_of_both_batches():
    # TOFU's idk loss (and OU's GradDiff-style retain term): HF's model(**inputs).loss = mean CE over valid tokens.
    idk, idk_labels = _random_lm_batch(5)
    ret, ret_labels = _random_lm_batch(6, prompt_lengths=(1, 1), lengths=(5, 6))
    ce_idk, valid_idk = _ou_token_ce(idk, idk_labels)
    ce_ret, valid_ret = _ou_token_ce(ret, ret_labels)
    hf = ce_idk[valid_idk].mean() + ce_ret[valid_ret].mean()
    ours = idk_nll_loss(*sequence_logprobs(idk, idk_labels), *sequence_logprobs(ret, ret_labels), 1.0, 1.0, "batch")
    assert ours.item() == pytest.approx(hf.item(), rel=1e-6)


def test_undial_batch_average_is_openunlearnings_on_fully_labelled_rows():
    # OU's compute_undial_loss: mask one-hot of the shifted labels, soft = softmax(teacher − mask·β), CE(student,
    # soft) with reduction none, then .mean() over EVERY position. With every position an answer token the
    # conventions agree; with prompt or padding positions OU also averages those in (where label −100 indexes
    # vocabulary entry V−100), which this code does not.
    student, labels = _random_lm_batch(7, prompt_lengths=(0, 0), lengths=(6, 6))
    teacher = _random_lm_batch(8)[0]
    shift_labels, shift_student, shift_teacher = labels[..., 1:], student[..., :-1, :], teacher[..., :-1, :]
    mask = torch.zeros_like(shift_teacher)
    mask[torch.arange(2).view(-1, 1, 1), torch.arange(5).view(1, -1, 1), shift_labels.unsqueeze(-1)] = 1.0
    soft = torch.softmax(shift_teacher - mask * 10.0, dim=-1)
    ou = torch.nn.CrossEntropyLoss(reduction="none")(
        shift_student.reshape(-1, student.size(-1)), soft.reshape(-1, soft.size(-1))
    ).mean()
    assert undial_loss(student, teacher, labels, 10.0, "batch").item() == pytest.approx(ou.item(), rel=1e-6)
    # equal answer lengths: the per-sequence mean agrees too
    assert undial_loss(student, teacher, labels, 10.0).item() == pytest.approx(ou.item(), rel=1e-6)


@pytest.mark.parametrize("method", ["wga", "satimp"])
def test_token_weighted_ga_batch_average_is_openunlearnings(method):
    # OU's compute_wga_loss / compute_satimp_loss: weights from exp(−CE) detached, −(w·CE)[valid].mean().
    logits, labels = _random_lm_batch(9)
    ce, valid = _ou_token_ce(logits, labels)
    p = (-ce).exp()
    weights = p**1.0 if method == "wga" else p**5.0 * (1 - p) ** 1.0
    ou = -(weights * ce)[valid].mean()
    token_logps, answer_mask = answer_token_logprobs(logits, labels)
    ours = (
        wga_loss(token_logps, answer_mask, 1.0, "batch")
        if method == "wga"
        else satimp_loss(token_logps, answer_mask, 5.0, 1.0, "batch")
    )
    assert ours.item() == pytest.approx(ou.item(), rel=1e-6)
    # Different answer lengths (5 and 1 tokens): the per-sequence default weighs the rows equally and differs.
    seq = wga_loss(token_logps, answer_mask) if method == "wga" else satimp_loss(token_logps, answer_mask)
    assert abs(seq.item() - ou.item()) > 0.05 * abs(ou.item())


def _rmu_batch():
    """Block outputs (B 2, T 3, d 2); labels: row 0 answers at positions 1-2, row 1 at position 1 (position 2 pads)."""
    activations = T([[[1.0, 1.0], [3.0, 0.0], [0.0, 0.0]], [[2.0, 2.0], [0.0, 4.0], [9.0, 9.0]]])
    labels = T([[IGNORE_INDEX, 5, 6], [IGNORE_INDEX, 7, IGNORE_INDEX]])
    attention_mask = T([[1, 1, 1], [1, 1, 0]])
    return activations, labels, attention_mask


def test_rmu_forget_loss_fixed_numbers():
    # c·u = (1, 0). (1/d)·‖h − c·u‖² per position: row 0: 0.5, 2, 0.5; row 1: 2.5, 8.5, 72.5.
    activations, labels, attention_mask = _rmu_batch()
    answer = rmu_positions(labels, attention_mask)
    assert answer.tolist() == [[False, True, True], [False, True, False]]
    target = T([1.0, 0.0])
    # answer positions, per sequence: mean((2 + 0.5)/2, 8.5) = 4.875; per position of the batch: 11/3
    assert rmu_forget_loss(activations, target, answer).item() == pytest.approx(4.875, rel=1e-6)
    assert rmu_forget_loss(activations, target, answer, "batch").item() == pytest.approx(11 / 3, rel=1e-6)
    # every non-padding position: mean((0.5 + 2 + 0.5)/3, (2.5 + 8.5)/2) = 3.25
    everywhere = rmu_positions(labels, attention_mask, "all")
    assert rmu_forget_loss(activations, target, everywhere).item() == pytest.approx(3.25, rel=1e-6)
    with pytest.raises(ValueError, match="positions='prompt'; use one of answer, all"):
        rmu_positions(labels, attention_mask, "prompt")


def test_rmu_retain_loss_fixed_numbers_and_a_frozen_target():
    # frozen = activations + 1 on the first coordinate: (1/d)·1² = 0.5 at every position, whatever the mask.
    activations, labels, attention_mask = _rmu_batch()
    frozen = (activations + T([1.0, 0.0])).requires_grad_(True)
    policy = activations.clone().requires_grad_(True)
    loss = rmu_retain_loss(policy, frozen, rmu_positions(labels, attention_mask))
    assert loss.item() == pytest.approx(0.5, rel=1e-6)
    loss.backward()
    assert frozen.grad is None
    # ∂/∂h of (1/d)·(h − f)² at h − f = −1: −2/d = −1 per element, divided by |answer positions| of the row, / B.
    assert torch.allclose(policy.grad[0, 1], T([-0.25, 0.0])) and torch.allclose(policy.grad[1, 1], T([-0.5, 0.0]))
    assert policy.grad[:, 0].abs().sum() == 0 and policy.grad[1, 2].abs().sum() == 0


def test_rmu_control_vector_is_a_seeded_scaled_unit_vector():
    control = rmu_control_vector(16, steering_coeff=6.5, seed=3)
    assert control.shape == (16,) and control.norm().item() == pytest.approx(6.5, rel=1e-6)
    assert (control >= 0).all()  # u ~ U[0, 1)^d before normalising, as the reference code draws it
    assert torch.equal(control, rmu_control_vector(16, 6.5, 3))
    assert not torch.equal(control, rmu_control_vector(16, 6.5, 4))


def test_rmu_terms_equal_openunlearnings_activation_loss_and_the_wmdp_mse():
    # OU's RMU.compute_activation_loss: mse_loss(reduction="none") (B, T, d), masked by labels != −100,
    # .mean(dim=2).sum(dim=1) / num_tokens per sample, then the mean over the batch; the control vector is
    # rand(1, 1, d) / norm · steering_coeff, expanded to (B, T, d).
    generator = torch.Generator().manual_seed(11)
    activations = torch.randn(3, 5, 8, generator=generator)
    frozen = torch.randn(3, 5, 8, generator=generator)
    labels = torch.randint(0, 50, (3, 5), generator=generator)
    labels[0, :2] = IGNORE_INDEX
    labels[1, :4] = IGNORE_INDEX
    attention_mask = torch.ones(3, 5, dtype=torch.long)

    def ou_activation_loss(a1, a2, mask):
        squared = torch.nn.functional.mse_loss(a1, a2, reduction="none")
        summed = (squared * mask.unsqueeze(-1).expand_as(squared)).mean(dim=2).sum(dim=1)
        return (summed / mask.sum(dim=-1, keepdim=True)).mean()

    # OU divides the (B,) per-sample sums by num_tokens of shape (B, 1): a (B, B) broadcast, so its value is the
    # per-sample mean only at batch size 1 (its WMDP experiment's per_device_train_batch_size). Ours (sequence) is
    # the mean of OU's batch-size-1 values; at B > 1 OU's is mean_i(sum_i) · mean_j(1/n_j), which it does not mean.
    control = rmu_control_vector(8, 2.0, seed=0)
    ou_mask = labels != -100
    target = control.view(1, 1, -1).expand_as(activations)
    answer = rmu_positions(labels, attention_mask)
    rows = range(len(labels))
    ou_forget = sum(ou_activation_loss(activations[[i]], target[[i]], ou_mask[[i]]) for i in rows) / len(labels)
    assert rmu_forget_loss(activations, control, answer).item() == pytest.approx(ou_forget.item(), rel=1e-6)
    ou_retain = sum(ou_activation_loss(activations[[i]], frozen[[i]], ou_mask[[i]]) for i in rows) / len(labels)
    assert rmu_retain_loss(activations, frozen, answer).item() == pytest.approx(ou_retain.item(), rel=1e-6)
    per_row_sums = ((activations - frozen).pow(2).mean(-1) * ou_mask).sum(-1)
    broadcast = per_row_sums.mean() * (1 / ou_mask.sum(-1).float()).mean()
    assert ou_activation_loss(activations, frozen, ou_mask).item() == pytest.approx(broadcast.item(), rel=1e-6)
    # The WMDP reference code: F.mse_loss over every position of an unpadded batch = positions all, batch average.
    everywhere = rmu_positions(labels, attention_mask, "all")
    wmdp = torch.nn.functional.mse_loss(activations, frozen)
    assert rmu_retain_loss(activations, frozen, everywhere, "batch").item() == pytest.approx(wmdp.item(), rel=1e-6)
    # answer lengths differ (3, 1, 5): the per-position average is not OU's
    assert rmu_retain_loss(activations, frozen, answer, "batch").item() != pytest.approx(ou_retain.item(), rel=1e-3)
