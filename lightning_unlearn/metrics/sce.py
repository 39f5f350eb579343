"""Suppression–Collapse Efficiency (LENS Section 6, "Suppression, degradation, and SCE").

For one evaluation set: B = base outputs labeled Reproduced; A = *non-degraded* post-unlearning outputs labeled
Reproduced; D = post-unlearning outputs flagged Degraded; N = evaluated post-unlearning outputs.

    ΔR = B − A,   s = max(B − A, 0) / max(B, 1),   g = D / N,   SCE = s · (1 − g)²
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torchmetrics import Metric

from lightning_unlearn.data.narratives import LEVELS
from lightning_unlearn.errors import ConfigError


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
            raise ConfigError(f"{name}={v} is a count and cannot be negative.")
    if total == 0:
        raise ConfigError("total=0: SCE needs at least one evaluated output (N > 0).")
    if degraded > total or post_reproduced > total:
        raise ConfigError(f"degraded={degraded} and post_reproduced={post_reproduced} cannot exceed total={total}.")
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
        raise ConfigError(
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
# What :func:`outcome_counts` counts, in this order (the columns of :class:`SuppressionCollapseEfficiency`'s state).
COUNT_FIELDS = ("N", "B", *(f"{x}_{v}" for v in SCE_VARIANTS for x in ("A", "D")), *OUTCOMES)


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


def outcome_counts(base_reproduced: Sequence[bool], outcomes: Sequence[SCEOutcome]) -> dict[str, int]:
    """The counts behind SCE for one set of outputs: :data:`COUNT_FIELDS` (N, B, A and D per variant, each outcome).

    A of a variant counts reproduced outputs that the variant does not call degraded (:func:`sce_counts`).
    """
    if len(base_reproduced) != len(outcomes):
        raise ConfigError(f"{len(base_reproduced)} base flags for {len(outcomes)} outputs; pass one per output.")
    counts = {"N": len(outcomes), "B": sum(bool(b) for b in base_reproduced)}
    for variant in SCE_VARIANTS:
        degraded = [bool(getattr(o, f"degraded_{variant}")) for o in outcomes]
        counts[f"A_{variant}"] = sum(o.reproduced and not d for o, d in zip(outcomes, degraded))
        counts[f"D_{variant}"] = sum(degraded)
    counts.update({k: sum(bool(getattr(o, k)) for o in outcomes) for k in OUTCOMES})
    return counts


def breakdown_from_counts(counts: Mapping[str, int]) -> dict:
    """:func:`sce_breakdown` of outputs whose :func:`outcome_counts` are ``counts`` (summed over sets or ranks)."""
    result: dict = {}
    for variant in SCE_VARIANTS:
        score = sce_score(counts["B"], counts[f"A_{variant}"], counts[f"D_{variant}"], counts["N"])
        if variant == "sce":
            result.update(score)
        else:
            suffix = variant.removeprefix("sce")
            result.update({variant: score["sce"], f"g{suffix}": score["g"], f"D{suffix}": score["D"]})
    n = counts["N"]
    result["counts"] = {k: int(counts[k]) for k in OUTCOMES}
    result["rates"] = {k: counts[k] / n for k in OUTCOMES}
    return result


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

    Raises:
        ValueError: the flags and outcomes differ in length, or there are no outputs (N = 0).
    """
    return breakdown_from_counts(outcome_counts(base_reproduced, outcomes))


class SuppressionCollapseEfficiency(Metric):
    """SCE as a ``torchmetrics.Metric``: the counts behind it per suite level, summed over batches and processes.

    ``update`` counts each output (:func:`outcome_counts`) into its level's row of one integer state reduced with
    ``sum``, so under DDP or FSDP each rank updates with its own outputs and Lightning's (or torchmetrics') sync
    adds the rows before SCE is formed once — the pooled SCE is not a mean of per-rank SCEs. :meth:`compute` gives
    one number (``variant`` at ``level``), so ``self.log("sce", metric)`` works in any LightningModule;
    :meth:`breakdown` gives everything :class:`~lightning_unlearn.callbacks.SCEEvaluation` writes per checkpoint.

    Args:
        levels: the levels counted (one state row each); an output of another level is refused.
        pooled_levels: the levels pooled into ``"pooled"`` (LENS: L0–L2, the levels checkpoint selection reads);
            those not among ``levels`` count nothing.
        variant: what :meth:`compute` returns: one of :data:`SCE_VARIANTS`, or ``s`` / ``g``.
        level: the level :meth:`compute` reads, or ``"pooled"``.
        kwargs: ``torchmetrics.Metric``'s (e.g. ``sync_on_compute``).

    Raises:
        ValueError: an unknown ``variant``, a ``level`` not counted, or no levels.

    Example::

        >>> from lightning_unlearn.metrics import SuppressionCollapseEfficiency, classify_output
        >>> sce = SuppressionCollapseEfficiency(levels=["L0"], level="L0")
        >>> outcomes = [
        ...     classify_output(base_reproduced=True, reproduced=False, unhealthy=False),  # suppressed, healthy
        ...     classify_output(base_reproduced=True, reproduced=True, unhealthy=False),  # still reproduced
        ... ]
        >>> sce.update([True, True], outcomes, "L0")
        >>> round(float(sce.compute()), 3)  # s = (2 - 1) / 2, g = 0
        0.5
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(
        self,
        levels: Sequence[str] = LEVELS,
        pooled_levels: Sequence[str] = ("L0", "L1", "L2"),
        variant: str = "sce",
        level: str = "pooled",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.levels = tuple(dict.fromkeys(levels))
        self.pooled_levels = tuple(dict.fromkeys(pooled_levels))
        if not self.levels:
            raise ConfigError("SuppressionCollapseEfficiency needs at least one level, e.g. levels=['L0'].")
        if variant not in (*SCE_VARIANTS, "s", "g"):
            raise ConfigError(f"variant={variant!r}; choose one of {[*SCE_VARIANTS, 's', 'g']}.")
        if level != "pooled" and level not in self.levels:
            raise ConfigError(f"level={level!r} is not counted; choose 'pooled' or one of {list(self.levels)}.")
        self.variant = variant
        self.level = level
        self.add_state(
            "counts", torch.zeros(len(self.levels), len(COUNT_FIELDS), dtype=torch.long), dist_reduce_fx="sum"
        )

    def update(
        self, base_reproduced: Sequence[bool], outcomes: Sequence[SCEOutcome], levels: str | Sequence[str]
    ) -> None:
        """Count outputs: per output the base flag, :func:`classify_output`, and its level (or one level for all).

        Raises:
            ValueError: lengths differ, or a level is not among ``levels``.
        """
        per_output = [levels] * len(outcomes) if isinstance(levels, str) else list(levels)
        if len(per_output) != len(outcomes) or len(base_reproduced) != len(outcomes):
            raise ConfigError(
                f"{len(base_reproduced)} base flags, {len(outcomes)} outcomes and {len(per_output)} levels; pass "
                "one of each per output."
            )
        if unknown := sorted(set(per_output) - set(self.levels)):
            raise ConfigError(
                f"levels {unknown} are not counted; construct the metric with levels={list(self.levels)} + these."
            )
        add = torch.zeros_like(self.counts)
        for i, lv in enumerate(self.levels):
            idx = [k for k, x in enumerate(per_output) if x == lv]
            if idx:
                c = outcome_counts([base_reproduced[k] for k in idx], [outcomes[k] for k in idx])
                add[i] = torch.tensor([c[f] for f in COUNT_FIELDS], dtype=torch.long)
        self.counts += add

    def _breakdown(self, counts: torch.Tensor) -> dict:
        rows = counts.cpu().tolist()
        levels = {
            lv: breakdown_from_counts(dict(zip(COUNT_FIELDS, row))) for lv, row in zip(self.levels, rows) if row[0] > 0
        }
        pooled_rows = [row for lv, row in zip(self.levels, rows) if lv in self.pooled_levels]
        pooled = [sum(col) for col in zip(*pooled_rows)]
        return {
            "levels": levels,
            "pooled": breakdown_from_counts(dict(zip(COUNT_FIELDS, pooled))) if pooled and pooled[0] else None,
        }

    def breakdown(self) -> dict:
        """``{"levels": {level: sce_breakdown}, "pooled": sce_breakdown | None}`` over every process's outputs.

        A level without outputs is left out; ``pooled`` is ``None`` when no pooled level has outputs.
        """
        with self.sync_context(
            dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync, should_unsync=self._should_unsync
        ):
            return self._breakdown(self.counts)

    def compute(self) -> torch.Tensor:
        """``variant`` at ``level`` as a float64 scalar.

        Raises:
            ValueError: no output of ``level`` (or of any pooled level) was counted.
        """
        found = self._breakdown(self.counts)
        result = found["pooled"] if self.level == "pooled" else found["levels"].get(self.level)
        if result is None:
            raise ConfigError(f"SCE at {self.level!r}: no output of that level was counted; update with some first.")
        return torch.tensor(result[self.variant], dtype=torch.float64)
