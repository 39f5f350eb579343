"""Calibrating the responsiveness judge per narrative from a few labeled answers, and choosing which to label.

Which answers to label (:func:`pick_for_labeling`). A sample of ``n`` answers of a run's pool is drawn in two
strata: a *near* stratum, the ``2·n_near`` healthy answers whose judge score lies closest to the current threshold
(where labels change the decision), of which ``n_near = round(near_share · n)`` are drawn, and the *rest* of the
pool, of which the other ``n − n_near`` are drawn. Within each stratum the draw is systematic over the answers sorted
by run, level and step, so the sample spreads over methods, levels and checkpoints, and every answer of the stratum
has the same inclusion probability π (stratum draws / stratum size). Each labeled answer carries the weight 1/π, so
a rate over the labels weighted so (Horvitz–Thompson) estimates the rate over the whole pool without bias although
the near stratum is oversampled.

The head (:func:`fit_head`) is a logistic regression (scikit-learn, L2, ``C``) of "real answer" on the judge's
inputs (the answer's embedding, cos(answer, question), the largest cos(answer, hypothesis)), weighted by 1/π. Its
threshold (:func:`head_threshold`) is set on the out-of-fold log-odds: at most the weighted ``max_answers_flagged``
quantile of the real answers, and no higher than needed to catch the broken answers below that bound.

How well it does (:func:`cross_validated_decisions`): nested cross-validation. Each outer fold's head and threshold
are fitted on the other folds alone (the threshold from an inner cross-validation of those), then decide the
held-out fold; the held-out decisions of all folds give D's recall and the share of real answers flagged, with
Wilson intervals at the weighted sample's effective size (Kish: (Σw)² / Σw²). Pure numpy / scikit-learn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.labelers.calibration import wilson_bounds
from lightning_unlearn.labelers.responsiveness_judge import JudgeHead

MIN_PER_CLASS = 4  # labeled real answers and broken answers a narrative needs for a cross-validated head


@dataclass(frozen=True)
class Pick:
    """One answer chosen for labeling: its index in the pool, its stratum and the weight 1/π it carries."""

    index: int
    stratum: str  # "near" (close to the threshold) or "random" (the rest of the pool)
    weight: float


def _systematic(order: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
    """``k`` of ``order`` at a fixed interval from a random start: each item's inclusion probability is k / len."""
    if k <= 0 or not order:
        return []
    step = len(order) / k
    start = rng.uniform(0, step)
    return [order[min(int(start + j * step), len(order) - 1)] for j in range(k)]


def pick_for_labeling(
    scores: Sequence[float],
    thresholds: Sequence[float],
    healthy: Sequence[bool],
    strata_keys: Sequence[tuple],
    n: int,
    near_share: float = 0.5,
    seed: int = 0,
) -> list[Pick]:
    """Choose ``n`` answers of a pool to label (see the module docstring).

    Args:
        scores: each answer's judge score.
        thresholds: the threshold its score is judged against.
        healthy: the answer passes the generation-health flags (only healthy answers are judged, so only they can
            be near the threshold).
        strata_keys: a sort key per answer, e.g. ``(run, level, step)``: the draw spreads over them.
        n: answers to pick (all of the pool when it has no more).
        near_share: the share of ``n`` drawn near the threshold; 0 = a plain random sample.
        seed: the draw's seed.

    Returns:
        The picks in pool order.
    """
    if not 0 <= near_share <= 1:
        raise ConfigError(f"near_share={near_share} must be in [0, 1]: it is the share of picks near the threshold.")
    if n < 1:
        raise ConfigError(f"n={n} must be at least 1 (answers to label).")
    size = len(scores)
    if not (size == len(thresholds) == len(healthy) == len(strata_keys)):
        raise ConfigError("scores, thresholds, healthy and strata_keys must have one entry per answer.")
    if n >= size:
        return [Pick(i, "random", 1.0) for i in range(size)]
    rng = np.random.default_rng(seed)
    tiebreak = rng.permutation(size)
    distance = np.abs(np.asarray(scores, dtype=np.float64) - np.asarray(thresholds, dtype=np.float64))
    candidates = sorted((i for i in range(size) if healthy[i]), key=lambda i: (distance[i], tiebreak[i]))
    n_near = min(int(round(near_share * n)), len(candidates) // 2)
    band = set(candidates[: 2 * n_near])
    rest = [i for i in range(size) if i not in band]
    # a sample larger than the rest of the pool: draw all of the rest and more of the band
    n_near = n - min(n - n_near, len(rest))

    def spread(items) -> list[int]:
        return sorted(items, key=lambda i: (*strata_keys[i], tiebreak[i]))

    near = _systematic(spread(band), n_near, rng)
    far = _systematic(spread(rest), n - n_near, rng)
    picks = [Pick(i, "near", len(band) / n_near) for i in near]
    picks += [Pick(i, "random", len(rest) / (n - n_near)) for i in far]
    return sorted(picks, key=lambda p: p.index)


def weighted_rate(hits: Sequence[bool], weights: Sequence[float], confidence: float = 0.95) -> dict:
    """A weighted share of ``hits`` with a Wilson interval at the effective sample size (Kish).

    Returns:
        ``{"value", "hits", "of", "n_eff", "ci"}`` (``value`` ``None`` and ``ci`` ``[0, 1]`` when nothing is counted).
    """
    h, w = np.asarray(hits, dtype=bool), np.asarray(weights, dtype=np.float64)
    if len(h) == 0 or w.sum() <= 0:
        return {"value": None, "hits": 0, "of": 0, "n_eff": 0.0, "ci": [0.0, 1.0]}
    p = float(w[h].sum() / w.sum())
    n_eff = float(w.sum() ** 2 / (w**2).sum())
    low, high = wilson_bounds(p, n_eff, confidence)
    return {"value": round(p, 4), "hits": int(h.sum()), "of": len(h), "n_eff": round(n_eff, 2),
            "ci": [round(low, 4), round(high, 4)]}  # fmt: skip


def fit_head(inputs: np.ndarray, is_answer: np.ndarray, weights: np.ndarray, c: float = 1.0):
    """A logistic regression of "real answer" on the judge inputs (scikit-learn; L2 with inverse strength ``c``)."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, max_iter=5000).fit(inputs, is_answer.astype(int), sample_weight=weights)


def head_threshold(
    log_odds: np.ndarray, is_answer: np.ndarray, weights: np.ndarray, max_answers_flagged: float
) -> float:
    """The judge's threshold on out-of-fold log-odds: answers scoring under it are not responsive.

    The highest threshold allowed is the largest real answer's log-odds with at most ``max_answers_flagged``
    (weighted) of the real answers below it. Below that, the threshold goes down to the middle of the gap above the
    highest broken answer it still catches: raising it further would flag real answers and catch no broken one.
    """
    real = np.flatnonzero(is_answer)
    if not len(real):
        raise ConfigError("no labeled real answer to place the judge's threshold against.")
    order = real[np.argsort(log_odds[real], kind="stable")]
    w = weights[order] / weights[order].sum()
    below = np.concatenate([[0.0], np.cumsum(w)[:-1]])  # weighted share strictly below each real answer
    highest = float(log_odds[order[np.flatnonzero(below <= max_answers_flagged + 1e-12)[-1]]])
    caught = log_odds[~is_answer & (log_odds < highest)]
    if not len(caught):
        return float(log_odds[order[0]])  # nothing to catch below the allowed bound: flag no real answer
    top = float(caught.max())
    return (top + float(log_odds[real][log_odds[real] >= top].min())) / 2


def _folds(is_answer: np.ndarray, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import StratifiedKFold

    minority = int(min(is_answer.sum(), len(is_answer) - is_answer.sum()))
    k = min(5, minority)
    if k < 2:
        raise ConfigError("too few labels of one class to cross-validate the judge's head.")
    splitter = StratifiedKFold(k, shuffle=True, random_state=seed)
    return list(splitter.split(np.zeros(len(is_answer)), is_answer.astype(int)))


def fit_calibrated_head(
    inputs: np.ndarray, is_answer: np.ndarray, weights: np.ndarray, max_answers_flagged: float, c: float = 1.0,
    seed: int = 0,
) -> JudgeHead:  # fmt: skip
    """The head fitted on every labeled answer, with the threshold from its out-of-fold log-odds."""
    log_odds = np.zeros(len(is_answer))
    for train, test in _folds(is_answer, seed):
        log_odds[test] = fit_head(inputs[train], is_answer[train], weights[train], c).decision_function(inputs[test])
    threshold = head_threshold(log_odds, is_answer, weights, max_answers_flagged)
    model = fit_head(inputs, is_answer, weights, c)
    return JudgeHead(coef=tuple(float(v) for v in model.coef_[0]), intercept=float(model.intercept_[0]),
                     threshold=threshold)  # fmt: skip


def cross_validated_heads(
    inputs: np.ndarray, is_answer: np.ndarray, weights: np.ndarray, max_answers_flagged: float, c: float = 1.0,
    seed: int = 0,
) -> list[tuple[np.ndarray, JudgeHead]]:  # fmt: skip
    """Nested cross-validation: per outer fold, ``(held-out indices, the head fitted without them)``, each head's
    threshold from an inner cross-validation of its training folds (:func:`fit_calibrated_head`)."""
    out = []
    for train, test in _folds(is_answer, seed):
        head = fit_calibrated_head(inputs[train], is_answer[train], weights[train], max_answers_flagged, c, seed)
        out.append((test, head))
    return out
