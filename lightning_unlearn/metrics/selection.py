"""Checkpoint selection from per-checkpoint SCE rows (LENS Section 5): suppression-tradeoff and first collapse."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def select_checkpoints(points: Iterable[dict], collapse_boundary: float = 0.5) -> dict:
    """The suppression-tradeoff checkpoint (max pooled L0–L2 SCE) and the first-collapse checkpoint.

    Args:
        points: one dict per checkpoint with ``step``, ``sce`` and ``g`` (pooled over the selection levels);
            L3 / L3-special never enter selection.
        collapse_boundary: first collapse is the earliest step whose degradation rate g reaches this value.

    Returns:
        ``{"suppression_tradeoff": {"step", "sce", "s", "g"} | None, "first_collapse": {"step", "g"} | None,
        "collapse_boundary", "num_checkpoints"}``; ties in SCE go to the earliest step.
    """
    if not 0 < collapse_boundary <= 1:
        raise ValueError(f"collapse_boundary={collapse_boundary} must be in (0, 1]: it is a degraded-output rate.")
    pts = sorted((p for p in points if p.get("sce") is not None), key=lambda p: int(p["step"]))
    best = None
    for p in pts:
        if best is None or p["sce"] > best["sce"]:
            best = p
    collapse = next((p for p in pts if p.get("g") is not None and p["g"] >= collapse_boundary), None)
    return {
        "suppression_tradeoff": None if best is None else
        {"step": int(best["step"]), "sce": best["sce"], "s": best.get("s"), "g": best.get("g")},
        "first_collapse": None if collapse is None else {"step": int(collapse["step"]), "g": collapse["g"]},
        "collapse_boundary": collapse_boundary,
        "num_checkpoints": len(pts),
    }


def sce_table(rows: Sequence[dict], family: str = "sce") -> dict[str, dict[int, dict]]:
    """``{level or "pooled": {step: {sce, s, g, ...}}}`` from ``checkpoint_metrics.jsonl`` rows of ``family``."""
    table: dict[str, dict[int, dict]] = {}
    for r in rows:
        if r.get("family") != family:
            continue
        step = int(r["step"])
        for level, vals in (r.get("levels") or {}).items():
            table.setdefault(level, {})[step] = vals
        if r.get("pooled"):
            table.setdefault("pooled", {})[step] = r["pooled"]
    return table
