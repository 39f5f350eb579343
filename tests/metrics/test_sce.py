import pytest

from lightning_unlearn.metrics.sce import sce_counts, sce_score


def test_sce_matches_hand_computed_values():
    # B=10, A=4, D=2, N=20: s = 6/10, g = 2/20, SCE = 0.6 * 0.9^2 = 0.486.
    r = sce_score(10, 4, 2, 20)
    assert r["delta_r"] == 6
    assert r["s"] == pytest.approx(0.6)
    assert r["g"] == pytest.approx(0.1)
    assert r["sce"] == pytest.approx(0.486)


def test_sce_no_suppression_and_zero_base():
    assert sce_score(3, 5, 0, 10)["s"] == 0.0  # more reproduction after unlearning: s clipped at 0
    r = sce_score(0, 0, 0, 5)  # max(B, 1) guards the division
    assert r["s"] == 0.0 and r["sce"] == 0.0
    full_collapse = sce_score(4, 0, 4, 4)  # everything suppressed by degrading everything
    assert full_collapse["s"] == 1.0 and full_collapse["sce"] == 0.0


def test_sce_counts_excludes_degraded_reproductions():
    b, a, d, n = sce_counts([True, True, False], [True, False, True], [True, False, False])
    # The first post output is reproduced but degraded, so only the third counts towards A.
    assert (b, a, d, n) == (2, 1, 1, 3)


def test_sce_rejects_bad_counts():
    with pytest.raises(ValueError, match="total=0"):
        sce_score(1, 0, 0, 0)
    with pytest.raises(ValueError, match="cannot exceed"):
        sce_score(1, 0, 5, 3)
    with pytest.raises(ValueError, match="differ in length"):
        sce_counts([True], [True, False], [False])
