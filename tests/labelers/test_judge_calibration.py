"""Choosing answers to label and calibrating the judge's head: inclusion probabilities that make the weighted
estimates unbiased, weighted rates and thresholds worked out by hand, and held-out decisions of nested folds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_unlearn.labelers.judge_calibration import (
    cross_validated_heads,
    fit_calibrated_head,
    head_threshold,
    pick_for_labeling,
    weighted_rate,
)


def _pool(size: int = 40):
    scores = np.linspace(-2.0, 2.0, size)  # the threshold 0 sits in the middle of the pool
    keys = [("npo" if i % 2 else "ga", f"L{i % 3}", 10 * (1 + i % 4)) for i in range(size)]
    return scores, [0.0] * size, [i % 10 != 0 for i in range(size)], keys


def test_picks_near_the_threshold_and_at_random_carry_the_weight_of_their_stratum():
    scores, thresholds, healthy, keys = _pool()
    picks = pick_for_labeling(scores, thresholds, healthy, keys, n=10, near_share=0.5, seed=3)
    near = [p for p in picks if p.stratum == "near"]
    assert len(picks) == 10 and len(near) == 5 and len({p.index for p in picks}) == 10
    # the near stratum is the 2 × 5 healthy answers closest to the threshold; the rest is the other 30
    band = sorted(sorted((i for i in range(40) if healthy[i]), key=lambda i: abs(scores[i]))[:10])
    assert all(p.index in band for p in near) and all(p.weight == 2.0 for p in near)
    assert all(p.index not in band and p.weight == 6.0 for p in picks if p.stratum == "random")
    # every answer is drawn with probability 1/weight: over many draws the frequencies match
    counts = np.zeros(40)
    draws = 3000
    for seed in range(draws):
        for p in pick_for_labeling(scores, thresholds, healthy, keys, n=10, near_share=0.5, seed=seed):
            counts[p.index] += 1
    expected = np.array([1 / 2 if i in band else 1 / 6 for i in range(40)])
    assert np.abs(counts / draws - expected).max() < 0.04
    # a weighted mean over the labels estimates the pool's mean without bias, the near stratum oversampled or not
    values = (scores > 0.5).astype(float)
    estimates = []
    for seed in range(400):
        ps = pick_for_labeling(scores, thresholds, healthy, keys, n=10, near_share=0.5, seed=seed)
        w = np.array([p.weight for p in ps])
        estimates.append(float((w * values[[p.index for p in ps]]).sum() / w.sum()))
    assert np.mean(estimates) == pytest.approx(values.mean(), abs=0.03)


def test_a_random_draw_spreads_over_runs_levels_and_steps():
    scores, thresholds, healthy, keys = _pool(36)
    keys = [(f"run{i % 3}", "L0", 10) for i in range(36)]
    picks = pick_for_labeling(scores, thresholds, healthy, keys, n=3, near_share=0.0, seed=0)
    assert sorted(keys[p.index][0] for p in picks) == ["run0", "run1", "run2"]  # one of each run
    assert all(p.weight == 12.0 and p.stratum == "random" for p in picks)
    # most of the pool: all of the rest is drawn, the band supplies the others; no answer twice, weights sum to 36
    most = pick_for_labeling(scores, thresholds, healthy, keys, n=30, near_share=0.5, seed=1)
    assert len({p.index for p in most}) == 30 and sum(p.weight for p in most) == pytest.approx(36)
    everything = pick_for_labeling(scores, thresholds, healthy, keys, n=50)
    assert [p.index for p in everything] == list(range(36)) and all(p.weight == 1.0 for p in everything)
    with pytest.raises(ValueError, match="near_share=1.5"):
        pick_for_labeling(scores, thresholds, healthy, keys, n=3, near_share=1.5)


def test_weighted_rate_and_its_interval_at_the_effective_sample_size():
    rate = weighted_rate([True, False, True], [2.0, 1.0, 1.0])
    # p = (2 + 1) / 4 = 0.75; Kish n_eff = 4² / (4 + 1 + 1) = 8/3
    assert rate["value"] == 0.75 and rate["n_eff"] == pytest.approx(8 / 3, abs=0.01) and rate["hits"] == 2
    z, n, p = 1.959964, 8 / 3, 0.75
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert rate["ci"] == pytest.approx([center - half, center + half], abs=1e-3)
    equal = weighted_rate([True] * 3 + [False], [1.0] * 4)  # unweighted: the usual Wilson interval of 3 of 4
    assert equal["value"] == 0.75 and equal["ci"] == pytest.approx([0.3006, 0.9544], abs=1e-3)
    assert weighted_rate([], [])["value"] is None


def test_the_threshold_flags_at_most_the_allowed_share_of_real_answers_and_no_more_than_it_needs():
    real = [0.1, 0.5, 0.9, 1.3]
    log_odds, is_answer = np.array(real + [-2.0, 0.3, 0.7]), np.array([True] * 4 + [False] * 3)
    # real answers below each real answer: 0, 1/4, 2/4, 3/4. At most 1/4 may be flagged, so the threshold may go up
    # to 0.5; the highest broken answer below 0.5 is 0.3, the next real answer above it 0.5: the threshold is their
    # middle, 0.4 (flags the real 0.1 and catches -2.0 and 0.3).
    assert head_threshold(log_odds, is_answer, np.ones(7), 0.25) == pytest.approx(0.4)
    # at most 1/10: the bound is 0.1; only -2.0 lies below, the gap's middle is (-2.0 + 0.1) / 2
    assert head_threshold(log_odds, is_answer, np.ones(7), 0.1) == pytest.approx(-0.95)
    # weighted: the lowest real answer weighs half of all real weight, so it may not be flagged at 0.25
    assert head_threshold(log_odds, is_answer, np.array([3.0, 1, 1, 1, 1, 1, 1]), 0.25) == pytest.approx(-0.95)
    # nothing broken below the bound: flag no real answer
    assert head_threshold(np.array(real + [2.0]), np.array([True] * 4 + [False]), np.ones(5), 0.25) == 0.1
    with pytest.raises(ValueError, match="no labeled real answer"):
        head_threshold(log_odds, np.zeros(7, dtype=bool), np.ones(7), 0.1)


def test_nested_folds_hold_every_answer_out_once_and_decide_separable_answers():
    rng = np.random.default_rng(0)
    is_answer = np.array([True] * 12 + [False] * 12)
    inputs = rng.normal(size=(24, 6)) + np.where(is_answer, 2.0, -2.0)[:, None]
    folds = cross_validated_heads(inputs, is_answer, np.ones(24), 0.1)
    held = np.concatenate([test for test, _ in folds])
    assert len(folds) == 5 and sorted(held.tolist()) == list(range(24))
    for test, head in folds:  # each head, fitted without its fold, decides that fold
        responsive = head.log_odds(inputs[test]) >= head.threshold
        assert (responsive == is_answer[test]).all()
    final = fit_calibrated_head(inputs, is_answer, np.ones(24), 0.1)
    assert len(final.coef) == 6 and ((final.log_odds(inputs) >= final.threshold) == is_answer).all()
