"""The before / after table of the attacks, read from a run's rows."""

from __future__ import annotations

import doctest

import lightning_unlearn.metrics.attacks as attacks_module
from lightning_unlearn.metrics.attacks import attack_table


def _sce(sce, s, reproduced, level_s):
    pooled = {"sce": sce, "s": s, "g": 0.1, "B": 4, "N": 10, "D": 1, "counts": {"reproduced": reproduced}}
    return {"pooled": pooled, "levels": {"L0": {**pooled, "s": level_s}}}


def test_each_condition_in_order_with_its_sce_share_and_retain_drift():
    rows = [
        {"step": 10, "family": "sce", **_sce(0.2, 0.5, 2, 0.6)},
        {"step": 10, "family": "retain_drift", "delta_ce": 0.1},
        {"step": 20, "family": "sce", **_sce(0.3, 0.75, 1, 0.8)},  # a step nobody attacked: not in the table
        {"step": 10, "family": "relearning_attack", "records": 6,
         "after_30": {"sce": _sce(0.0, 0.0, 4, 0.0), "retain_drift": {"delta_ce": 0.4}},
         "after_10": {"sce": _sce(0.1, 0.25, 3, 0.2), "retain_drift": {"delta_ce": 0.3}}},
        {"step": 10, "family": "quantization_attack",
         "int4": {"sce": _sce(0.05, 0.25, 3, 0.1), "retain_drift": {"delta_ce": 1.0}},
         "int8": {"sce": _sce(0.2, 0.5, 2, 0.6), "retain_drift": {"delta_ce": 0.1}}, "group_size": 128},
    ]  # fmt: skip
    table = attack_table(rows)
    assert list(table) == [10]
    assert list(table[10]) == ["full precision", "int8", "int4", "relearn 10", "relearn 30"]
    assert [r["s"] for r in table[10].values()] == [0.5, 0.5, 0.25, 0.25, 0.0]
    assert [r["reproduced"] for r in table[10].values()] == [2, 2, 3, 3, 4]
    assert [r["retain_delta_ce"] for r in table[10].values()] == [0.1, 0.1, 1.0, 0.3, 0.4]
    assert [r["s"] for r in attack_table(rows, level="L0")[10].values()] == [0.6, 0.6, 0.1, 0.2, 0.0]
    assert attack_table([r for r in rows if "attack" not in r["family"]]) == {}


def test_the_modules_example_runs():
    result = doctest.testmod(attacks_module)
    assert result.attempted >= 2 and result.failed == 0
