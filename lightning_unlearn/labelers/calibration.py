"""Calibration of predicted ``Reproduced`` labels against manual labels (LENS Section 6 and Appendix C, Table 8).

Two positive classes: *strict* = Target-Dominant, *broad* = Target-Dominant or Target-Included. Rows whose manual
label is Invalid are left out. Precision and recall get Wilson score intervals; F1 gets a percentile bootstrap
interval over rows (seeded). Pure numpy; no Lightning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lightning_unlearn.labelers.manual_labels import (
    MANUAL_INVALID,
    TARGET_DOMINANT,
    TARGET_INCLUDED,
    ManualLabels,
    normalize_manual_label,
)
from lightning_unlearn.labelers.narrative_label import REPRODUCED, NarrativeLabel

SCHEMES = {"strict": (TARGET_DOMINANT,), "broad": (TARGET_DOMINANT, TARGET_INCLUDED)}


def _z(confidence: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; ``(0, 1)`` when there are no trials.

    center = (p + z²/2n) / (1 + z²/n),  half = z·sqrt(p(1−p)/n + z²/4n²) / (1 + z²/n).
    """
    if trials == 0:
        return 0.0, 1.0
    z = _z(confidence)
    p = successes / trials
    denom = 1 + z * z / trials
    center = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def _f1(tp, fp, fn):
    denom = 2 * tp + fp + fn
    return np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)


def _as_bool(pred) -> bool:
    if isinstance(pred, NarrativeLabel):
        return pred.reproduced
    if isinstance(pred, str):
        return pred == REPRODUCED
    return bool(pred)


def calibration_report(
    predicted_reproduced: Sequence,
    manual_labels: ManualLabels | Sequence[str],
    n_bootstrap: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict:
    """Precision, recall and F1 of predicted reproduction against manual labels, strict and broad.

    Args:
        predicted_reproduced: one prediction per row: bools, label strings (``"Reproduced"``) or NarrativeLabels.
        manual_labels: the manual labels in the same order (a :class:`ManualLabels` or label strings).
        n_bootstrap: bootstrap resamples for the F1 interval.
        seed: bootstrap seed.
        confidence: interval level.

    Returns:
        ``{"n", "n_invalid_excluded", "counts", "confidence", "strict": {...}, "broad": {...}}``; each scheme has
        ``tp, fp, fn, tn, support, precision, precision_ci, recall, recall_ci, f1, f1_ci``.
    """
    raw = manual_labels.labels if isinstance(manual_labels, ManualLabels) else list(manual_labels)
    manual = []
    for lbl in raw:
        canon = normalize_manual_label(lbl)
        if canon is None:
            raise ValueError(f"unknown manual label {lbl!r}; use Target-Dominant/Included/Rejected or Invalid.")
        manual.append(canon)
    if len(manual) != len(predicted_reproduced):
        raise ValueError(f"{len(predicted_reproduced)} predictions for {len(manual)} manual labels; give one each.")
    keep = [i for i, m in enumerate(manual) if m != MANUAL_INVALID]
    pred = np.array([_as_bool(predicted_reproduced[i]) for i in keep], dtype=bool)
    kept = [manual[i] for i in keep]
    counts = {lbl: kept.count(lbl) for lbl in sorted(set(kept))}
    report = {
        "n": len(keep),
        "n_invalid_excluded": len(manual) - len(keep),
        "counts": counts,
        "confidence": confidence,
    }
    rng = np.random.default_rng(seed)
    boot_idx = rng.integers(0, len(keep), size=(n_bootstrap, len(keep))) if keep and n_bootstrap > 0 else None
    for scheme, positives in SCHEMES.items():
        truth = np.array([m in positives for m in kept], dtype=bool)
        tp = int((pred & truth).sum())
        fp = int((pred & ~truth).sum())
        fn = int((~pred & truth).sum())
        tn = int((~pred & ~truth).sum())
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        f1 = float(_f1(np.array(tp), np.array(fp), np.array(fn)))
        if boot_idx is not None:
            p, t = pred[boot_idx], truth[boot_idx]
            f1s = _f1((p & t).sum(1), (p & ~t).sum(1), (~p & t).sum(1))
            alpha = (1 - confidence) / 2 * 100
            f1_ci = (float(np.percentile(f1s, alpha)), float(np.percentile(f1s, 100 - alpha)))
        else:
            f1_ci = (0.0, 1.0)
        report[scheme] = {
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "tn": tn,
            "support": int(truth.sum()),
            "precision": precision,
            "precision_ci": wilson_interval(tp, tp + fp, confidence),
            "recall": recall,
            "recall_ci": wilson_interval(tp, tp + fn, confidence),
            "f1": f1,
            "f1_ci": f1_ci,
        }
    return report


def format_calibration_table(report: dict, title: str = "Weak labels vs manual labels") -> str:
    """A plain-text table in the layout of LENS Table 8."""
    pct = int(round(report["confidence"] * 100))
    lines = [
        f"{title} (n={report['n']}; "
        + ", ".join(f"{k} {v}" for k, v in report["counts"].items())
        + (f"; {report['n_invalid_excluded']} Invalid excluded)" if report["n_invalid_excluded"] else ")"),
        f"{'Scheme':<8}{'TP':>5}{'FP':>5}{'FN':>5}{'TN':>5}  {'Precision [' + str(pct) + '% CI]':<24}"
        f"{'Recall [' + str(pct) + '% CI]':<24}{'F1 [' + str(pct) + '% CI]':<24}",
    ]
    for scheme in SCHEMES:
        r = report[scheme]

        def cell(v, ci):
            return f"{v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"

        lines.append(
            f"{scheme.capitalize():<8}{r['tp']:>5}{r['fp']:>5}{r['fn']:>5}{r['tn']:>5}  "
            f"{cell(r['precision'], r['precision_ci']):<24}{cell(r['recall'], r['recall_ci']):<24}"
            f"{cell(r['f1'], r['f1_ci']):<24}"
        )
    lines.append(
        "Strict = Target-Dominant; Broad = Target-Dominant + Target-Included. Wilson CIs for P/R, bootstrap for F1."
    )
    return "\n".join(lines)
