"""The Lacuna filter: greedy extraction per field on the non-instruction profiles, then the memorization-filtered
splits (``data/splits.py``: forget / retain with TOFU's truth-ratio columns, and the membership-inference members and
non-members) as ``datasets`` directories beside ``extraction.json``: ``lightning-unlearn lacuna filter``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from lightning_unlearn.data.splits import build_splits, save_splits
from lightning_unlearn.data.testbed_data import data_forget_retain_groups, load_holdout_profiles, load_table
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.workflows.lacuna.extraction import extraction_rates

logger = logging.getLogger("lightning_unlearn")


def filter_stage(
    model_dir: str,
    data_dir: str,
    out_dir: str,
    seed: int = 0,
    write_splits: bool = True,
    groups: Sequence[int] | None = None,
) -> dict:
    """Measure extraction on the non-instruction profiles and write the memorization-filtered splits.

    ``groups`` restricts the measurement to those groups' profiles (for a run injected with ``data.groups``);
    the others count as not memorized, so they join no split.
    """
    from lightning_unlearn.models import load_causal_lm, load_tokenizer

    profiles = list(load_table(data_dir, "profiles"))
    if groups is not None:
        present = sorted({int(p["group_id"]) for p in profiles})
        missing = sorted(set(groups) - set(present))
        if missing:
            raise ConfigError(f"groups {missing} have no profile in {data_dir!r}; its groups are {present}.")
    targets = [p for p in profiles if not p["instruct"] and (groups is None or p["group_id"] in groups)]
    if not targets:
        raise ConfigError(f"{data_dir!r} has no non-instruction profile to measure extraction on.")
    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    rates, memorized = extraction_rates(model, tokenizer, targets)
    report = {
        "model": str(model_dir),
        "groups": sorted(groups) if groups is not None else None,
        "profiles": len(targets),
        "extraction": rates,
        "memorized": {f: sorted(ids) for f, ids in memorized.items()},
    }
    splits = {}
    if write_splits:
        holdout = load_holdout_profiles(data_dir)
        if not holdout:
            logger.warning(
                "[lacuna] warning: %s has no held-out people (holdout_profiles), so no membership-inference splits "
                "are written; rebuild the data with holdout_per_group > 0 for mia/members and mia/nonmembers.",
                data_dir,
            )
        forget, retain = data_forget_retain_groups(data_dir)
        splits = build_splits(profiles, memorized, seed, forget, retain, holdout=holdout)
    if write_splits:
        report["split_sizes"] = {name: len(rows) for name, rows in splits.items()}
        empty = [name for name, n in report["split_sizes"].items() if n == 0 and name.endswith("forget")]
        if empty:
            logger.warning("[lacuna] warning: no memorized profile for %s; those splits are empty.", ", ".join(empty))
    save_splits(out_dir, splits, {"extraction.json": json.dumps(report, indent=1)})
    return report


def filter_command(
    *,
    model: str = "runs/lacuna/inject/export/inj",
    data: str = "runs/lacuna/data",
    out: str = "runs/lacuna/splits",
    seed: int = 0,
    groups: list[int] | None = None,
) -> dict:
    """Measure extraction per field and write the memorization-filtered splits.

    Greedy answers on the non-instruction profiles; the splits are ``datasets`` directories next to
    ``extraction.json``; the result is the profile count, the rates and the split sizes.

    Args:
        model: the model to measure.
        data: the testbed data directory.
        out: where the splits and ``extraction.json`` go.
        seed: seed of the split assignment.
        groups: measure only these groups' profiles (a run injected with ``data.groups``).
    """
    report = filter_stage(model, data, out, seed, groups=groups)
    return {k: report[k] for k in ("profiles", "extraction", "split_sizes")}


__all__ = ["filter_command", "filter_stage"]
