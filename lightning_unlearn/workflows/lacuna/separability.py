"""Whether a Lacuna testbed has the ground truth it claims (Lacuna Sec. 3, Algorithm 1): each group's PII lives in
its own mask and nowhere else, and the injected model keeps general text.

For each group g, θ_inj with g's mask elements set back to θ_pre must forget g's people (extraction ≤
``forgotten_max``, 0.1) and keep every other group's (≥ ``kept_min`` = 0.9× its rate on θ_inj); the same for the
forget groups m^F and the retain groups m^R as wholes. And θ_inj's utility CE on the testbed's held-out ``utility``
paragraphs (no stage trains on them) must be within ``utility_max_delta`` (0.5 nat) of θ_pre's. Extraction is the
filter's (greedy answer to the canonical probe contains the PII value), pooled over the four target fields of each
group's non-instruction profiles.

Without this, mask AUC has nothing to localize against, OracleGrad (restricted to m^F) also erases the retain
people, and resurfacing means nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from lightning_unlearn.data.collate import encode_document, pad_batch
from lightning_unlearn.data.templates import TARGET_FIELDS
from lightning_unlearn.data.testbed_data import data_forget_retain_groups, forget_retain_groups, load_table
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.labelers.calibration import wilson_interval
from lightning_unlearn.losses import sequence_logprobs
from lightning_unlearn.masks import canonical_name, group_mask, load_masks
from lightning_unlearn.workflows.lacuna.extraction import extraction_rates

FORGET_GROUPS, RETAIN_GROUPS = forget_retain_groups(6)  # the paper's G_1-G_3 and G_4-G_6


def utility_ce(model, tokenizer, texts: Sequence[str], max_length: int = 128, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats per token) of ``model`` on ``texts``, each encoded as the stages
    encode documents (BOS first, every token a label)."""
    rows = [encode_document(tokenizer, t, max_length) for t in texts]
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = pad_batch(rows[start : start + batch_size], tokenizer.pad_token_id)
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            logps, lengths = sequence_logprobs(logits, batch["labels"])
            total -= float(logps.sum())
            count += int(lengths.sum())
    return total / max(count, 1)


def group_extraction(model, tokenizer, profiles: Sequence[dict], fields: Sequence[str] = TARGET_FIELDS) -> dict:
    """``{"<group id>": {"hits": n, "trials": m, "rate": n/m}}``: extracted (profile, field) pairs per group (string
    keys, as the report is read back from JSON)."""
    _, memorized = extraction_rates(model, tokenizer, profiles, fields)
    out = {}
    for g in sorted({int(p["group_id"]) for p in profiles}):
        ids = {p["profile_id"] for p in profiles if int(p["group_id"]) == g}
        hits = sum(len(ids & memorized[f]) for f in fields)
        trials = len(ids) * len(fields)
        out[str(g)] = {"hits": hits, "trials": trials, "rate": hits / trials}
    return out


class _Reset:
    """Set chosen groups' mask elements of ``model`` to θ_pre for the length of a ``with`` block."""

    def __init__(self, model, pre: dict[str, torch.Tensor], packed: dict[str, torch.Tensor], groups: Sequence[int]):
        self.params = {canonical_name(n): p for n, p in model.named_parameters()}
        self.pre, self.packed, self.groups = pre, packed, list(groups)
        self.saved: dict[str, torch.Tensor] = {}

    def __enter__(self):
        with torch.no_grad():
            for name, packed in self.packed.items():
                mask = group_mask(packed, self.groups)
                if name in self.params and mask.any():
                    p = self.params[name]
                    self.saved[name] = p.detach().clone()
                    p.copy_(torch.where(mask, self.pre[name].to(p.dtype), p))
        return self

    def __exit__(self, *exc):
        with torch.no_grad():
            for name, value in self.saved.items():
                self.params[name].copy_(value)


def separability_report(
    export_dir: str | Path,
    data_dir: str | Path,
    forget_groups: Sequence[int] | None = None,
    retain_groups: Sequence[int] | None = None,
    forgotten_max: float = 0.1,
    kept_min: float = 0.9,
    utility_max_delta: float = 0.5,
    memorized_min: float = 0.5,
) -> dict:
    """Measure an injection export (``<root>/export`` with ``pre/``, ``inj/``, ``masks.safetensors``).

    Returns ``{"extraction": {g: {hits, trials, rate}}, "resets": {name: {"groups": [...], "extraction": {g: ...},
    "met": bool, "failures": [str]}}, "utility": {"pre": ce, "inj": ce, "delta": ce, "uniform": ln|V|, "met":
    bool}, "unmemorized": [g], "thresholds": {...}, "met": bool}``, resets named ``group g``, ``m^F`` and ``m^R``.

    A group that θ_inj extracts below ``memorized_min`` has nothing a reset could take away: its resets pass
    vacuously, so such a group fails the verdict (``unmemorized``) instead of passing it. ``forget_groups`` and
    ``retain_groups`` default to the data's (:func:`~lightning_unlearn.data.testbed_data.forget_retain_groups`:
    0-2 and 3-5 of six groups).
    """
    from lightning_unlearn.models import load_causal_lm, load_tokenizer, load_weights

    default_forget, default_retain = data_forget_retain_groups(data_dir)
    forget_groups = default_forget if forget_groups is None else forget_groups
    retain_groups = default_retain if retain_groups is None else retain_groups
    export_dir = Path(export_dir)
    pre_dir, inj_dir = export_dir / "pre", export_dir / "inj"
    model, tokenizer = load_causal_lm(inj_dir), load_tokenizer(inj_dir)
    pre = load_weights(pre_dir)
    packed, meta = load_masks(export_dir / "masks.safetensors", model)
    packed = dict(packed)
    profiles = [p for p in load_table(str(data_dir), "profiles") if not p["instruct"]]
    groups = sorted({int(p["group_id"]) for p in profiles})
    missing = sorted((set(forget_groups) | set(retain_groups)) - set(groups))
    if missing:
        raise ConfigError(f"groups {missing} have no evaluation profile in {str(data_dir)!r}; its groups are {groups}.")

    utility_texts = list(load_table(str(data_dir), "utility")["text"])
    pre_model = load_causal_lm(pre_dir)
    ce_pre, ce_inj = utility_ce(pre_model, tokenizer, utility_texts), utility_ce(model, tokenizer, utility_texts)
    del pre_model
    vocab = model.get_input_embeddings().num_embeddings
    utility = {"pre": ce_pre, "inj": ce_inj, "delta": ce_inj - ce_pre, "uniform": math.log(vocab)}
    utility["met"] = utility["delta"] <= utility_max_delta

    from tqdm.auto import tqdm

    base = group_extraction(model, tokenizer, profiles)
    resets = {}
    plans = [(f"group {g}", [g]) for g in groups] + [("m^F", list(forget_groups)), ("m^R", list(retain_groups))]
    # The rates go to the table the chain prints after this (format_separability), once; here only progress.
    for name, reset in tqdm(plans, desc="separability resets", leave=False, disable=None):
        with _Reset(model, pre, packed, reset):
            measured = group_extraction(model, tokenizer, profiles)
        failures = []
        for g in groups:
            rate, before = measured[str(g)]["rate"], base[str(g)]["rate"]
            if g in reset and rate > forgotten_max:
                failures.append(f"group {g} still extracts {rate:.2f} > {forgotten_max}")
            elif g not in reset and rate < kept_min * before:
                failures.append(f"group {g} falls to {rate:.2f} < {kept_min}×{before:.2f}")
        resets[name] = {"groups": reset, "extraction": measured, "met": not failures, "failures": failures}
    unmemorized = [g for g in groups if base[str(g)]["rate"] < memorized_min]
    return {
        "extraction": base,
        "resets": resets,
        "utility": utility,
        "unmemorized": unmemorized,
        "masks": {k: meta.get(k) for k in ("num_groups", "coverage", "mask_seed")},
        "thresholds": {
            "forgotten_max": forgotten_max,
            "kept_min": kept_min,
            "utility_max_delta": utility_max_delta,
            "memorized_min": memorized_min,
        },  # fmt: skip
        "met": utility["met"] and not unmemorized and all(r["met"] for r in resets.values()),
    }


def format_separability(report: dict) -> str:
    """The report as a text table: extraction per group on θ_inj and with each group (or m^F, m^R) reset, with
    Wilson 95 % intervals on θ_inj's rates, and the utility line."""
    groups = sorted(report["extraction"], key=int)
    head = f"{'θ_inj with … reset':<22}" + "".join(f"{'group ' + str(g):>10}" for g in groups) + "  verdict"
    lines = ["Separability (extraction per group; a reset group must forget, the others keep ≥ 0.9× their rate)", head]
    base = report["extraction"]
    lines.append(f"{'nothing (θ_inj)':<22}" + "".join(f"{base[g]['rate']:>10.2f}" for g in groups))
    cis = [wilson_interval(base[g]["hits"], base[g]["trials"]) for g in groups]
    lines.append(f"{'  95% interval':<22}" + "".join(f"{f'{lo:.2f}-{hi:.2f}':>10}" for lo, hi in cis))
    if report.get("unmemorized"):
        lines[-1] += f"  FAILS: groups {report['unmemorized']} below {report['thresholds']['memorized_min']}"
    for name, r in report["resets"].items():
        cells = "".join(f"{r['extraction'][g]['rate']:>9.2f}{'*' if int(g) in r['groups'] else ' '}" for g in groups)
        lines.append(f"{name:<22}{cells}  {'ok' if r['met'] else 'FAILS: ' + _first_failures(r['failures'])}")
    u = report["utility"]
    limit = report["thresholds"]["utility_max_delta"]
    lines.append(
        f"utility CE on held-out text: θ_pre {u['pre']:.2f}, θ_inj {u['inj']:.2f} (Δ {u['delta']:+.2f} nat; "
        f"uniform {u['uniform']:.2f}) {'ok' if u['met'] else f'FAILS: more than {limit} nat'}"
    )
    return "\n".join(lines)


def _first_failures(failures: Sequence[str], shown: int = 2) -> str:
    """The first ``shown`` failures of a reset and how many more (all of them are in the report's JSON)."""
    more = len(failures) - shown
    return "; ".join(failures[:shown]) + (f"; {more} more" if more > 0 else "")


def separability_verdict(report: dict) -> str:
    """One line, as loud for "NOT met" as for "met"."""
    t = report["thresholds"]
    what = (
        f"separability (a group's reset leaves it ≤ {t['forgotten_max']} and the others ≥ {t['kept_min']}× their "
        f"rate; m^F and m^R too; utility within {t['utility_max_delta']} nat of θ_pre)"
    )
    if report["met"]:
        return f"[lacuna] {what}: met"
    failed = [name for name, r in report["resets"].items() if not r["met"]]
    if not report["utility"]["met"]:
        failed.append(f"utility Δ {report['utility']['delta']:+.2f} nat")
    unmemorized = report.get("unmemorized", [])  # reports written before the rule have none
    if unmemorized:
        failed.append(
            f"θ_inj extracts groups {unmemorized} below {t.get('memorized_min')}: nothing there for a reset to remove"
        )
    return (
        f"[lacuna] {what}: NOT met ({', '.join(failed)}). This testbed has no ground truth: mask AUC, OracleGrad and "
        "resurfacing on it measure artifacts (docs/results/lacuna_memorization.md)."
    )


def write_report(report: dict, path: str | Path) -> None:
    """Write the separability report as indented, key-sorted JSON, atomically.

    Args:
        report: the report.
        path: the file to write.
    """
    from lightning_unlearn.atomic import write_text_atomically

    write_text_atomically(path, json.dumps(report, indent=1, sort_keys=True, default=str))
