"""Before / after the attacks: one run's SCE and retain drift at each checkpoint, as trained and under each attack.

:func:`attack_table` reads the rows of one ``checkpoint_metrics.jsonl`` (the SCE and retain-drift families, and the
``quantization_attack`` / ``relearning_attack`` rows that hold the same evaluators' numbers on the attacked model) into
``{step: {condition: reading}}``, conditions in order: ``full precision``, ``int8``, ``int4``, …, ``relearn 10``,
``relearn 30``, …. ``lightning-unlearn report`` draws it and tabulates it at the selected checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

FULL_PRECISION = "full precision"
QUANTIZATION_FAMILY = "quantization_attack"
RELEARNING_FAMILY = "relearning_attack"


def _reading(sce: Mapping | None, retain: Mapping | None, level: str | None) -> dict:
    """SCE, s, g, the reproduced answers and D of one SCE metrics dict (pooled, or one level's) and retain ΔCE."""
    sce = sce or {}
    found = (sce.get("levels") or {}).get(level) if level else sce.get("pooled")
    found = found or {}
    counts = found.get("counts") or {}
    return {
        "sce": found.get("sce"),
        "s": found.get("s"),
        "g": found.get("g"),
        "B": found.get("B"),
        "N": found.get("N"),
        "reproduced": counts.get("reproduced"),
        "D": found.get("D"),
        "retain_delta_ce": (retain or {}).get("delta_ce"),
    }


def attack_key(key: str) -> tuple[str, int] | None:
    """What a key of an attack row names: ``("int", 4)`` for ``int4`` (a bit width of the quantization attack),
    ``("relearn", 30)`` for ``after_30`` (a point of the relearning attack's curve), ``None`` for anything else."""
    if key.startswith("int") and key[3:].isdigit():
        return "int", int(key[3:])
    if key.startswith("after_") and key[6:].isdigit():
        return "relearn", int(key[6:])
    return None


def _condition(key: str) -> str | None:
    kind = attack_key(key)
    return None if kind is None else (f"int{kind[1]}" if kind[0] == "int" else f"relearn {kind[1]}")


def _order(condition: str) -> tuple:
    if condition == FULL_PRECISION:
        return (0, 0)
    if condition.startswith("int"):
        return (1, -int(condition[3:]))  # int8 before int4
    return (2, int(condition.split()[-1]))


def attack_table(
    rows: Sequence[Mapping],
    sce_family: str = "sce",
    retain_family: str = "retain_drift",
    level: str | None = None,
) -> dict[int, dict[str, dict]]:
    """``{step: {condition: reading}}`` for every step that has an attack row (see the module docstring).

    Args:
        rows: one run's metric rows.
        sce_family: the SCE family (its rows, and its key inside the attack rows).
        retain_family: the retain-drift family, likewise.
        level: read this level's SCE (e.g. ``"L0"``) instead of the pooled one.

    Returns:
        A reading per condition: ``sce``, ``s``, ``g``, ``B``, ``N``, ``reproduced`` (answers reproducing the
        narrative), ``D`` and ``retain_delta_ce``; ``None`` where the run did not measure it.

    Example::

        >>> rows = [{"step": 5, "family": "sce", "pooled": {"sce": 0.4, "s": 0.5, "B": 4, "N": 8}},
        ...         {"step": 5, "family": "quantization_attack", "int4": {"sce": {"pooled": {"sce": 0.1, "s": 0.0}}}}]
        >>> {c: r["s"] for c, r in attack_table(rows)[5].items()}
        {'full precision': 0.5, 'int4': 0.0}
    """
    plain: dict[int, dict] = {}
    attacked: dict[int, dict] = {}
    for r in rows:
        family, step = r.get("family"), int(r["step"])
        if family in (sce_family, retain_family):
            plain.setdefault(step, {})[family] = r
        elif family in (QUANTIZATION_FAMILY, RELEARNING_FAMILY):
            for key, found in r.items():
                condition = _condition(key)
                if condition and isinstance(found, Mapping):
                    attacked.setdefault(step, {})[condition] = found
    table: dict[int, dict[str, dict]] = {}
    for step in sorted(attacked):
        own = plain.get(step, {})
        readings = {FULL_PRECISION: _reading(own.get(sce_family), own.get(retain_family), level)}
        for condition, found in attacked[step].items():
            readings[condition] = _reading(found.get(sce_family), found.get(retain_family), level)
        table[step] = dict(sorted(readings.items(), key=lambda item: _order(item[0])))
    return table


__all__ = ["FULL_PRECISION", "attack_key", "attack_table"]
