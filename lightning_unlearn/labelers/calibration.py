"""Calibration of predicted ``Reproduced`` labels against manual labels (LENS Section 6 and Appendix C, Table 8).

Two positive classes: *strict* = Target-Dominant, *broad* = Target-Dominant or Target-Included. Rows whose manual
label is Invalid are left out. Precision and recall get Wilson score intervals; F1 gets a percentile bootstrap
interval over rows (seeded). Pure numpy; no Lightning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lightning_unlearn.errors import ConfigError, MissingPathError
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
    return wilson_bounds(successes / trials, trials, confidence)


def wilson_bounds(p: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson interval of a proportion ``p`` observed on ``n`` trials, where ``n`` may be an effective, fractional
    sample size (a weighted sample's, Kish); ``(0, 1)`` when ``n`` is 0."""
    if n <= 0:
        return 0.0, 1.0
    z = _z(confidence)
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At p = 0 the lower end is exactly 0 and at p = 1 the upper end exactly 1; rounding leaves 3e-17 and 1 − 1e-16,
    # an interval that misses its own rate. Every interval holds its rate.
    return min(p, max(0.0, center - half)), max(p, min(1.0, center + half))


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
            raise ConfigError(f"unknown manual label {lbl!r}; use Target-Dominant/Included/Rejected or Invalid.")
        manual.append(canon)
    if len(manual) != len(predicted_reproduced):
        raise ConfigError(f"{len(predicted_reproduced)} predictions for {len(manual)} manual labels; give one each.")
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


# ------------------------------------------------------------------------------------------ answer validity
# The classes an annotator gives a post-unlearning answer (LENS Sec. 3: valid answer, degraded, or invalid).
VALIDITY_CLASSES = ("answer", "degraded", "non_answer", "refusal", "echo", "wrong_language")
# What SCE's D must hold (``degraded_sce``): broken answers and non-answers of every kind but refusal and echo.
BROKEN_CLASSES = ("degraded", "non_answer", "wrong_language")
# detector flag of an SCE generation row → the manual classes it should find
VALIDITY_DETECTORS = {
    "degraded": ("degraded",),
    "refusal": ("refusal",),
    "echo": ("echo",),
    "non_answer": ("non_answer",),
    "wrong_language": ("wrong_language",),
    "degraded_sce": BROKEN_CLASSES,
}


def normalize_validity_class(value: str) -> str:
    """The canonical class of an annotator's entry (``Non-answer``, ``non answer`` → ``non_answer``); raises on an
    unknown one, naming the classes."""
    canon = str(value).strip().lower().replace("-", "_").replace(" ", "_")
    if canon not in VALIDITY_CLASSES:
        raise ConfigError(f"unknown validity class {value!r}; use one of {', '.join(VALIDITY_CLASSES)}.")
    return canon


def validity_calibration_report(manual: Sequence[str], detected: Sequence[dict], confidence: float = 0.95) -> dict:
    """Precision and recall, with Wilson intervals, of every answer-validity detector against manual classes.

    Args:
        manual: one validity class per answer (:data:`VALIDITY_CLASSES`).
        detected: the SCE generation row of each answer (``SCEEvaluation.score``): the flags ``degraded``,
            ``refusal``, ``echo``, ``non_answer``, ``wrong_language`` and ``degraded_sce`` (in D).

    Returns:
        ``{"n", "counts", "confidence", "flags": {flag: {tp, fp, fn, support, precision, precision_ci, recall,
        recall_ci}}}``; ``flags["degraded_sce"]`` scores D against the broken classes (:data:`BROKEN_CLASSES`), the
        recall the verdict rests on.
    """
    classes = [normalize_validity_class(c) for c in manual]
    if len(classes) != len(detected):
        raise ConfigError(f"{len(detected)} detector rows for {len(classes)} manual classes; give one each.")
    if not classes:
        raise ConfigError("no annotated answers: fill the `validity` column of some rows of the exported CSV.")
    flags = {}
    for flag, positives in VALIDITY_DETECTORS.items():
        truth = [c in positives for c in classes]
        pred = [bool(row[flag]) for row in detected]
        tp = sum(t and p for t, p in zip(truth, pred))
        fp = sum(p and not t for t, p in zip(truth, pred))
        fn = sum(t and not p for t, p in zip(truth, pred))
        flags[flag] = {
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "support": sum(truth),
            "precision": tp / (tp + fp) if tp + fp else None,
            "precision_ci": wilson_interval(tp, tp + fp, confidence),
            "recall": tp / (tp + fn) if tp + fn else None,
            "recall_ci": wilson_interval(tp, tp + fn, confidence),
        }
    return {
        "n": len(classes),
        "counts": {c: classes.count(c) for c in VALIDITY_CLASSES},
        "confidence": confidence,
        "flags": flags,
    }


def format_validity_calibration(report: dict, title: str = "Answer-validity detectors vs manual classes") -> str:
    """A plain-text table: one line per detector with its precision and recall and their Wilson intervals."""
    pct = int(round(report["confidence"] * 100))
    counts = ", ".join(f"{k} {v}" for k, v in report["counts"].items() if v)
    lines = [
        f"{title} (n={report['n']}; {counts})",
        f"{'Detector':<16}{'support':>8}{'TP':>5}{'FP':>5}{'FN':>5}  {'Precision [' + str(pct) + '% CI]':<24}"
        f"{'Recall [' + str(pct) + '% CI]':<24}",
    ]

    def cell(v, ci):
        return "–" if v is None else f"{v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"

    for flag, r in report["flags"].items():
        name = "in D (broken)" if flag == "degraded_sce" else flag
        lines.append(
            f"{name:<16}{r['support']:>8}{r['tp']:>5}{r['fp']:>5}{r['fn']:>5}  "
            f"{cell(r['precision'], r['precision_ci']):<24}{cell(r['recall'], r['recall_ci']):<24}"
        )
    lines.append("in D (broken) = answers classed degraded, non_answer or wrong_language that SCE's D holds.")
    return "\n".join(lines)


def load_validity_calibration(path: str | None) -> dict | None:
    """A ``lens calibrate --validity_json`` file (``None`` → ``None``); raises naming the file and the fix."""
    if path is None:
        return None
    import json
    from pathlib import Path

    p = Path(path).expanduser()
    if not p.is_file():
        raise MissingPathError(
            f"validity calibration {str(p)!r} does not exist; write it with `lightning-unlearn lens calibrate "
            "--labels annotate.csv --validity_json FILE` from answers whose `validity` column you filled."
        )
    data = json.loads(p.read_text(encoding="utf-8"))
    if data.get("kind") != "lens-validity-calibration":
        raise ConfigError(f"{str(p)!r} is not a validity calibration (kind {data.get('kind')!r}); write it with "
                         "`lens calibrate --validity_json`.")  # fmt: skip
    return data
