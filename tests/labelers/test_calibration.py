"""calibration_report against P/R/F1 and Wilson intervals worked out by hand (LENS Appendix C, Table 8)."""

import pytest

from lightning_unlearn.labelers import ManualLabels, calibration_report, format_calibration_table, wilson_interval

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)

# 9 rows; the Invalid one is left out, leaving 4 Dominant, 2 Included, 2 Rejected.
MANUAL = [
    "Target-Dominant",
    "Target-Dominant",
    "Target-Dominant",
    "Target-Dominant",
    "Target-Included",
    "Target-Included",
    "Target-Rejected",
    "Target-Rejected",
    "Invalid",
]
PREDICTED = [True, True, True, False, True, False, True, False, True]


def test_wilson_interval_matches_hand_computed_values():
    # Roots of (p - k/n)^2 = z^2 p (1 - p) / n with z = 1.95996.
    assert wilson_interval(3, 5) == pytest.approx((0.230724, 0.882379), abs=1e-5)
    assert wilson_interval(3, 4) == pytest.approx((0.300642, 0.954413), abs=1e-5)
    assert wilson_interval(4, 6) == pytest.approx((0.299993, 0.903229), abs=1e-5)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(10, 10)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(0.722467, abs=1e-5)


def test_every_wilson_interval_holds_its_rate_at_the_ends():
    """At 0 of n the interval starts at exactly 0 and at n of n ends at exactly 1 (rounding gave 2.8e-17 for 0 of 10
    and 1 − 1.1e-16 for 13 of 13: an error bar below zero that matplotlib refuses)."""
    for n in range(1, 201):
        for k in range(n + 1):
            lo, hi = wilson_interval(k, n)
            assert lo <= k / n <= hi, (k, n, lo, hi)
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0


def test_strict_and_broad_precision_recall_f1():
    report = calibration_report(PREDICTED, MANUAL, n_bootstrap=500, seed=1)
    assert report["n"] == 8 and report["n_invalid_excluded"] == 1
    strict, broad = report["strict"], report["broad"]
    # Strict (Dominant): TP 3, FP 2 (one Included, one Rejected predicted), FN 1, TN 2.
    assert (strict["tp"], strict["fp"], strict["fn"], strict["tn"]) == (3, 2, 1, 2)
    assert strict["precision"] == pytest.approx(3 / 5)
    assert strict["recall"] == pytest.approx(3 / 4)
    assert strict["f1"] == pytest.approx(2 * 3 / (2 * 3 + 2 + 1))
    assert strict["precision_ci"] == pytest.approx((0.230724, 0.882379), abs=1e-5)
    assert strict["recall_ci"] == pytest.approx((0.300642, 0.954413), abs=1e-5)
    # Broad (Dominant + Included): TP 4, FP 1, FN 2, TN 1.
    assert (broad["tp"], broad["fp"], broad["fn"], broad["tn"]) == (4, 1, 2, 1)
    assert broad["precision"] == pytest.approx(4 / 5)
    assert broad["recall"] == pytest.approx(4 / 6)
    assert broad["f1"] == pytest.approx(8 / 11)
    assert broad["precision_ci"] == pytest.approx((0.375535, 0.963776), abs=1e-5)
    assert broad["recall_ci"] == pytest.approx((0.299993, 0.903229), abs=1e-5)


def test_bootstrap_f1_interval_is_seeded_and_brackets_the_estimate():
    a = calibration_report(PREDICTED, MANUAL, n_bootstrap=400, seed=7)
    b = calibration_report(PREDICTED, MANUAL, n_bootstrap=400, seed=7)
    c = calibration_report(PREDICTED, MANUAL, n_bootstrap=400, seed=8)
    assert a["strict"]["f1_ci"] == b["strict"]["f1_ci"]
    assert a["strict"]["f1_ci"] != c["strict"]["f1_ci"] or a["broad"]["f1_ci"] != c["broad"]["f1_ci"]
    for scheme in ("strict", "broad"):
        lo, hi = a[scheme]["f1_ci"]
        assert 0.0 <= lo <= a[scheme]["f1"] <= hi <= 1.0
        assert hi - lo > 0.1  # eight rows leave wide uncertainty


def test_accepts_label_strings_manual_labels_object_and_rejects_mismatch():
    manual = ManualLabels(tuple(str(i) for i in range(len(MANUAL))), tuple(MANUAL))
    as_strings = ["Reproduced" if p else "Not-reproduced" for p in PREDICTED]
    report = calibration_report(as_strings, manual, n_bootstrap=50)
    assert report["strict"]["tp"] == 3
    with pytest.raises(ValueError, match="predictions for 9 manual labels"):
        calibration_report(PREDICTED[:-1], MANUAL)
    with pytest.raises(ValueError, match="unknown manual label 'maybe'"):
        calibration_report([True], ["maybe"])


def test_table_layout():
    text = format_calibration_table(calibration_report(PREDICTED, MANUAL, n_bootstrap=100))
    lines = text.splitlines()
    assert "n=8" in lines[0] and "1 Invalid excluded" in lines[0]
    assert lines[2].startswith("Strict") and "0.600 [0.231, 0.882]" in lines[2] and "0.750 [0.301, 0.954]" in lines[2]
    assert lines[3].startswith("Broad") and "0.800 [0.376, 0.964]" in lines[3]


def _row(**flags):
    keys = ("degraded", "refusal", "echo", "non_answer", "wrong_language", "degraded_sce")
    return {k: flags.get(k, False) for k in keys}


def test_validity_calibration_counts_each_detector_against_the_manual_classes():
    from lightning_unlearn.labelers.calibration import validity_calibration_report

    manual = ["answer", "Non-answer", "degraded", "refusal", "non_answer", "wrong language"]
    detected = [
        _row(non_answer=True, degraded_sce=True),  # a real answer flagged: one false positive of each
        _row(non_answer=True, degraded_sce=True),
        _row(),  # a broken answer missed
        _row(refusal=True),
        _row(degraded=True, degraded_sce=True),  # in D, under another flag
        _row(wrong_language=True, degraded_sce=True),
    ]
    report = validity_calibration_report(manual, detected)
    assert report["n"] == 6 and report["counts"]["non_answer"] == 2 and report["counts"]["wrong_language"] == 1
    na, d = report["flags"]["non_answer"], report["flags"]["degraded_sce"]
    assert (na["tp"], na["fp"], na["fn"], na["precision"], na["recall"]) == (1, 1, 1, 0.5, 0.5)
    # D against degraded + non_answer + wrong_language (4 broken): caught 3, one real answer wrongly in D
    assert (d["tp"], d["fp"], d["fn"], d["support"]) == (3, 1, 1, 4) and d["recall"] == 0.75
    assert d["recall_ci"] == pytest.approx(wilson_interval(3, 4))
    assert report["flags"]["echo"]["recall"] is None and report["flags"]["refusal"]["precision"] == 1.0
    with pytest.raises(ValueError, match="unknown validity class 'broken'"):
        validity_calibration_report(["broken"], [_row()])
    with pytest.raises(ValueError, match="2 detector rows for 1 manual classes"):
        validity_calibration_report(["answer"], [_row(), _row()])
