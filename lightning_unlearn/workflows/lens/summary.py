"""``lightning-unlearn lens summary RUN_DIR``: one LENS trajectory at its selected checkpoint, as a short table.

Reads the run's ``checkpoint_metrics.jsonl`` (SCE and retain-drift rows written by the evaluation callbacks),
selects the suppression-tradeoff checkpoint (max pooled L0–L2 SCE) and the first-collapse checkpoint, and reports
B, A, D, N, s, g and SCE per level there, L3 / L3-special entity recovery before (the labeled baseline file) and
after (the selected checkpoint), and retain drift. Writes ``trajectory_summary.json`` into RUN_DIR.

    lightning-unlearn lens summary runs/lens/smollm2/nato-forced-war-en/npo \
        --baseline runs/lens/smollm2/nato-forced-war-en/baseline.jsonl
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lightning_unlearn.callbacks.sce_heatmap import write_json
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.labelers.calibration import load_validity_calibration
from lightning_unlearn.metrics.selection import sce_table, select_from_rows
from lightning_unlearn.workflows.run_directory import run_rows, selected_answers

SUMMARY_FILE = "trajectory_summary.json"


LEVEL_ORDER = ("L0", "L1", "L2", "pooled", "L3", "L3-special")
ENTITY_LEVELS = ("L3", "L3-special")


def baseline_entity_recovery(baseline_path: str | os.PathLike) -> dict[str, float]:
    """Per level, the fraction of labeled baseline answers with every actor recovered together with the frame."""
    path = Path(baseline_path)
    if not path.is_file():
        raise MissingPathError(f"baseline file {str(path)!r} does not exist; run `lens baseline` with --labeler.")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if rows and "entity_recovery" not in rows[0]:
        raise ConfigError(f"{str(path)!r} is not labeled; write it with `lens baseline --labeler signature`.")
    out: dict[str, float] = {}
    for level in sorted({r["level"] for r in rows}):
        sel = [bool(r["entity_recovery"]) for r in rows if r["level"] == level]
        out[level] = sum(sel) / len(sel)
    return out


def trajectory_summary(
    run_dir: str | os.PathLike,
    baseline_path: str | os.PathLike | None = None,
    collapse_boundary: float = 0.5,
    family: str = "sce",
    retain_family: str = "retain_drift",
    validity_calibration: str | None = None,
    min_validity_recall: float = 0.8,
) -> dict:
    """The selected checkpoints of one run and the per-level numbers at the suppression-tradeoff checkpoint.

    Args:
        run_dir: a run directory (searched recursively for ``checkpoint_metrics.jsonl``).
        baseline_path: labeled ``lens baseline`` JSONL, for entity recovery before unlearning.
        collapse_boundary: degraded-output rate g that marks collapse.
        family: metric family of the SCE rows.
        retain_family: metric family of the retain-drift rows.
        validity_calibration: a ``lens calibrate --validity_json`` file for this narrative.
        min_validity_recall: the share of broken answers D must catch for the detectors to count as verified.
    """
    rows = run_rows(run_dir)
    table = sce_table(rows, family)
    if not table.get("pooled"):
        raise ConfigError(
            f"no pooled {family!r} rows under {str(run_dir)!r}; was the run evaluated with SCEEvaluation?"
        )
    selection = select_from_rows(
        rows,
        family,
        collapse_boundary,
        retain_family=retain_family,
        validity_calibration=load_validity_calibration(validity_calibration),
        min_validity_recall=min_validity_recall,
    )
    step = selection["suppression_tradeoff"]["step"]
    levels = {lv: table[lv][step] for lv in LEVEL_ORDER if step in table.get(lv, {})}
    sce_row = next(r for r in rows if r.get("family") == family and int(r["step"]) == step)
    retain = {int(r["step"]): r for r in rows if r.get("family") == retain_family}
    keep = ("ce", "ppl", "delta_ce", "kl")
    after = {lv: levels[lv].get("entity_recovery_rate") for lv in ENTITY_LEVELS if lv in levels}
    return {
        "run_dir": str(run_dir),
        "answers": selected_answers(run_dir, step),
        "steps": sorted(table["pooled"]),
        "selection": selection,
        "selected_step": step,
        "levels": levels,
        "degraded_rate": sce_row.get("degraded_rate"),
        "retain_drift": {k: retain[step][k] for k in keep if step in retain and k in retain[step]},
        "retain_drift_last": (
            {k: retain[max(retain)][k] for k in keep if k in retain[max(retain)]} | {"step": max(retain)}
            if retain
            else {}
        ),
        "entity_recovery": {
            "before": {
                lv: v
                for lv, v in (baseline_entity_recovery(baseline_path).items() if baseline_path else [])
                if lv in ENTITY_LEVELS
            },
            "after": after,
        },
    }


def format_summary(summary: dict) -> str:
    """A plain-text table of :func:`trajectory_summary`."""
    sel = summary["selection"]
    collapse = sel["first_collapse"]
    lines = [
        f"run: {summary['run_dir']}",
        f"checkpoints: {summary['steps']}",
        f"suppression-tradeoff checkpoint: step {summary['selected_step']} ({sel['suppression_tradeoff']['verdict']}); "
        f"first collapse (g >= {sel['collapse_boundary']}): "
        f"{'none' if collapse is None else 'step ' + str(collapse['step'])}",
        "guarded checkpoint: "
        + (
            f"step {sel['guarded']['step']} ({sel['guarded']['verdict']})" if sel["guarded"] else sel["guarded_verdict"]
        ),
        f"validity detectors: {sel['validity']['reason']}",
        f"{'level':<11}{'B':>4}{'A':>4}{'D':>4}{'N':>4}{'s':>7}{'g':>7}{'SCE':>7}{'health':>7}{'strict':>7}"
        f"{'refus':>6}{'echo':>5}{'nonans':>7}{'clean':>6}",
    ]
    fmt = lambda x: "     –" if x is None else f"{x:>7.3f}"  # noqa: E731
    for lv, v in summary["levels"].items():
        c = v.get("counts", {})
        lines.append(
            f"{lv:<11}{v['B']:>4}{v['A']:>4}{v['D']:>4}{v['N']:>4}{v['s']:>7.3f}{v['g']:>7.3f}{v['sce']:>7.3f}"
            f"{fmt(v.get('sce_health'))}{fmt(v.get('sce_strict'))}{c.get('refusal', '–'):>6}{c.get('echo', '–'):>5}"
            f"{c.get('non_answer', '–'):>7}{c.get('clean_suppression', '–'):>6}"
        )
    er = summary["entity_recovery"]
    for lv in ENTITY_LEVELS:
        before, after = er["before"].get(lv), er["after"].get(lv)
        if before is not None or after is not None:
            fmt = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
            lines.append(f"{lv} entity recovery: before {fmt(before)}, after {fmt(after)}")
    rd = summary["retain_drift"]
    if rd:
        lines.append("retain drift at the selected step: " + ", ".join(f"{k} {v:.4g}" for k, v in rd.items()))
    if summary.get("answers"):
        lines.append(f"L0 answers at step {summary['selected_step']} (base → selected checkpoint: class):")
        cut = lambda t: "–" if t is None else (t if len(t) <= 100 else t[:99] + "…").replace("\n", " ")  # noqa: E731
        for a in summary["answers"]:
            base = "reproduced" if a["base_reproduced"] else "not reproduced"
            lines += [f"  {a['id']}", f"    base ({base}): {cut(a['base_answer'])}",
                      f"    step {summary['selected_step']}: {cut(a['answer'])}", f"    → {a['outcome']}"]  # fmt: skip
    return "\n".join(lines)


def summary_command(
    run_dir: str,
    baseline: str | None = None,
    collapse_boundary: float = 0.5,
    validity_calibration: str | None = None,
    min_validity_recall: float = 0.8,
) -> str:
    """One LENS trajectory at its selected checkpoint, as a short table.

    B, A, D, N, s, g and SCE per level at the suppression-tradeoff checkpoint, entity recovery before and after,
    and retain drift; the JSON goes to ``RUN_DIR/trajectory_summary.json``.

    Args:
        run_dir: the run directory (searched recursively for ``checkpoint_metrics.jsonl``).
        baseline: labeled ``lens baseline`` JSONL, for entity recovery before unlearning.
        collapse_boundary: degraded-output rate g that marks collapse.
        validity_calibration: a ``lens calibrate --validity_json`` file for this narrative (without one, no
            checkpoint is verified as a useful operating point).
        min_validity_recall: the share of broken answers D must catch for the detectors to count as verified.
    """
    summary = trajectory_summary(
        run_dir,
        baseline,
        collapse_boundary,
        validity_calibration=validity_calibration,
        min_validity_recall=min_validity_recall,
    )
    write_json(Path(run_dir) / SUMMARY_FILE, summary)
    return format_summary(summary)
