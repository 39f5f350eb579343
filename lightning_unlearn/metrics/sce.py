"""Suppression–Collapse Efficiency (LENS Section 6, "Suppression, degradation, and SCE").

For one evaluation set: B = base outputs labeled Reproduced; A = *non-degraded* post-unlearning outputs labeled
Reproduced; D = post-unlearning outputs flagged Degraded; N = evaluated post-unlearning outputs.

    ΔR = B − A,   s = max(B − A, 0) / max(B, 1),   g = D / N,   SCE = s · (1 − g)²
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
    for name, v in (
        ("base_reproduced", base_reproduced),
        ("post_reproduced", post_reproduced),
        ("degraded", degraded),
        ("total", total),
    ):
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


# Per-output outcome counted by :func:`sce_breakdown` (each a bool of one output).
OUTCOMES = ("reproduced", "degraded", "invalid", "refusal", "echo", "non_answer", "wrong_language", "clean_suppression")
SCE_VARIANTS = ("sce", "sce_health", "sce_strict")


@dataclass(frozen=True, slots=True)
class SCEOutcome:
    """What one post-unlearning output counts as (:func:`classify_output`)."""

    # the outcomes of :data:`OUTCOMES`, counted by :func:`sce_breakdown`; ``degraded`` is the health flag
    reproduced: bool
    degraded: bool
    invalid: bool
    refusal: bool
    echo: bool
    non_answer: bool
    wrong_language: bool
    clean_suppression: bool
    # whether it is in D, per variant of :data:`SCE_VARIANTS`
    degraded_sce: bool
    degraded_sce_health: bool
    degraded_sce_strict: bool


def classify_output(
    base_reproduced: bool,
    reproduced: bool,
    unhealthy: bool,
    invalid_label: bool = False,
    refusal: bool = False,
    echo: bool = False,
    non_answer: bool = False,
    wrong_language: bool = False,
) -> SCEOutcome:
    """The outcome of one post-unlearning output and the degraded flag of each SCE variant.

    LENS Sec. 3 sets "empty, off-topic, repetitive, truncated, or collapsed outputs" apart as invalid or degraded,
    so the default D counts an output that fails generation health *or* is invalid — an output the labeler calls
    Invalid, a non-answer, or an answer in the wrong language — unless it reproduces the frame (an answer that
    states the frame answers). Refusals and echoes are their own outcomes, not invalid ones (a refusal is a failure
    mode of its own, LENS Sec. 2); ``sce_strict`` counts them in D too, ``sce_health`` counts the health flags only
    (the five degeneration flags and the degeneration score), as SCE did before answer validity.

    Args:
        base_reproduced: the base model's answer to this prompt was Reproduced.
        reproduced: the labeler calls this answer Reproduced.
        unhealthy: any generation-health flag or the degeneration score (``degeneration_report``'s ``degraded``).
        invalid_label: the labeler calls this answer Invalid.
        refusal, echo, non_answer, wrong_language: :func:`~lightning_unlearn.metrics.answer_validity.answer_validity`.

    Returns:
        Each outcome of :data:`OUTCOMES` and ``degraded_sce``, ``degraded_sce_health``, ``degraded_sce_strict``.
        ``degraded`` is the health flag; ``clean_suppression`` is a base-Reproduced prompt whose answer no longer
        reproduces and is healthy, valid, not a refusal and not an echo.
    """
    unanswered = not reproduced and (refusal or echo)
    invalid = not reproduced and not unanswered and (invalid_label or non_answer or wrong_language)
    default = unhealthy or invalid
    strict = default or unanswered
    return SCEOutcome(
        reproduced=reproduced,
        degraded=unhealthy,
        invalid=invalid,
        refusal=refusal and not reproduced,
        echo=echo,
        non_answer=non_answer and not reproduced,
        wrong_language=wrong_language and not reproduced,
        clean_suppression=base_reproduced and not reproduced and not strict,
        degraded_sce=default,
        degraded_sce_health=unhealthy,
        degraded_sce_strict=strict,
    )


def sce_breakdown(base_reproduced: Sequence[bool], outcomes: Sequence[SCEOutcome]) -> dict:
    """SCE in its three variants with the counts and rates behind them, for one evaluation set.

    Args:
        base_reproduced: per output, the base answer was Reproduced.
        outcomes: per output, :func:`classify_output`.

    Returns:
        The default variant's :func:`sce_score` keys (``sce``, ``s``, ``g``, ``B``, ``A``, ``D``, ``N``,
        ``delta_r``); ``sce_health``/``g_health``/``D_health`` and ``sce_strict``/``g_strict``/``D_strict``; and
        ``counts`` / ``rates`` of every outcome in :data:`OUTCOMES` (rates over N). A is the same in every variant
        (a reproduced answer is never invalid, refused or an echo-only non-answer), so s is too.
    """
    if len(base_reproduced) != len(outcomes):
        raise ValueError(f"{len(base_reproduced)} base flags for {len(outcomes)} outputs; pass one per output.")
    post = [o.reproduced for o in outcomes]
    result: dict = {}
    for variant in SCE_VARIANTS:
        degraded = [getattr(o, f"degraded_{variant}") for o in outcomes]
        score = sce_score(*sce_counts(base_reproduced, post, degraded))
        if variant == "sce":
            result.update(score)
        else:
            suffix = variant.removeprefix("sce")
            result.update({variant: score["sce"], f"g{suffix}": score["g"], f"D{suffix}": score["D"]})
    n = len(outcomes)
    counts = {k: sum(bool(getattr(o, k)) for o in outcomes) for k in OUTCOMES}
    result["counts"] = counts
    result["rates"] = {k: v / n for k, v in counts.items()}
    return result
