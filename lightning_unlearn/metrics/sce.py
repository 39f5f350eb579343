"""Suppression–Collapse Efficiency (LENS Section 6, "Suppression, degradation, and SCE").

For one evaluation set: B = base outputs labeled Reproduced; A = *non-degraded* post-unlearning outputs labeled
Reproduced; D = post-unlearning outputs flagged Degraded; N = evaluated post-unlearning outputs.

    ΔR = B − A,   s = max(B − A, 0) / max(B, 1),   g = D / N,   SCE = s · (1 − g)²
"""

from __future__ import annotations

from collections.abc import Sequence


def sce_score(base_reproduced: int, post_reproduced: int, degraded: int, total: int) -> dict[str, float]:
    """SCE and its parts for one evaluation set.

    Args:
        base_reproduced: B, base-model outputs labeled Reproduced.
        post_reproduced: A, post-unlearning outputs labeled Reproduced that are *not* degraded.
        degraded: D, post-unlearning outputs flagged degraded.
        total: N, post-unlearning outputs evaluated.

    Returns:
        ``{"delta_r", "s", "g", "sce", "B", "A", "D", "N"}``.
    """
    for name, v in (("base_reproduced", base_reproduced), ("post_reproduced", post_reproduced),
                    ("degraded", degraded), ("total", total)):
        if v < 0:
            raise ValueError(f"{name}={v} is a count and cannot be negative.")
    if total == 0:
        raise ValueError("total=0: SCE needs at least one evaluated output (N > 0).")
    if degraded > total or post_reproduced > total:
        raise ValueError(f"degraded={degraded} and post_reproduced={post_reproduced} cannot exceed total={total}.")
    s = max(base_reproduced - post_reproduced, 0) / max(base_reproduced, 1)
    g = degraded / total
    return {
        "delta_r": float(base_reproduced - post_reproduced),
        "s": float(s),
        "g": float(g),
        "sce": float(s * (1.0 - g) ** 2),
        "B": int(base_reproduced),
        "A": int(post_reproduced),
        "D": int(degraded),
        "N": int(total),
    }


def sce_counts(
    base_reproduced: Sequence[bool], post_reproduced: Sequence[bool], degraded: Sequence[bool]
) -> tuple[int, int, int, int]:
    """(B, A, D, N) from per-prompt flags; A counts reproduced post outputs that are not degraded."""
    if not len(base_reproduced) == len(post_reproduced) == len(degraded):
        raise ValueError(
            f"per-prompt flags differ in length: base {len(base_reproduced)}, post {len(post_reproduced)}, "
            f"degraded {len(degraded)}; pass one flag per evaluated prompt in each."
        )
    b = sum(bool(x) for x in base_reproduced)
    a = sum(bool(r) and not bool(d) for r, d in zip(post_reproduced, degraded))
    d = sum(bool(x) for x in degraded)
    return b, a, d, len(degraded)
