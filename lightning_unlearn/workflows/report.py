"""``lightning-unlearn report RUN_DIR...``: cross-run SCE heatmap and checkpoint-selection summary.

Each RUN_DIR is searched recursively for ``checkpoint_metrics.jsonl`` (several logger versions of one run are
merged, later rows replacing earlier ones for the same step). Writes ``sce_heatmap.png``, ``summary.json`` and
``summary.md`` to ``--out`` and prints the table.

    lightning-unlearn report runs/ga runs/npo --out reports/nato-en --collapse-boundary 0.5

``lightning-unlearn mask-auc --pre DIR --inj DIR --unl DIR --masks FILE`` prints the localization AUC of one
unlearned model (every family, the composite and the max, against m^F and m^F ∨ m^R) as JSON.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from lightning_unlearn.atomic import write_text_atomically
from lightning_unlearn.callbacks.checkpoint_metrics_file import METRICS_FILE, read_rows, row_key
from lightning_unlearn.callbacks.sce_heatmap import save_figure, sce_heatmap_figure, write_json
from lightning_unlearn.metrics.selection import sce_table, select_from_rows


def run_rows(run_dir: str | os.PathLike) -> list[dict]:
    """All metric rows of one run directory (files found recursively, merged by (step, family))."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FileNotFoundError(f"run directory {str(run_dir)!r} does not exist.")
    files = sorted(run_dir.rglob(METRICS_FILE), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no {METRICS_FILE} under {str(run_dir)!r}; is it a run directory?")
    merged = {}
    for f in files:
        for r in read_rows(f):
            merged[row_key(r)] = r
    return [merged[k] for k in sorted(merged)]


def summarize(
    run_dirs: Sequence[str],
    family: str = "sce",
    collapse_boundary: float = 0.5,
    names: Sequence[str] | None = None,
    metric: str = "sce",
) -> tuple[dict, dict]:
    """``(tables, summary)``: per-run SCE tables and per-run selection."""
    names = list(names) if names else [Path(d).resolve().name for d in run_dirs]
    if len(names) != len(run_dirs):
        raise ValueError(f"{len(names)} names for {len(run_dirs)} run directories; give one name per directory.")
    if len(set(names)) != len(names):
        raise ValueError(f"run names {names} are not unique; pass --names to tell the runs apart.")
    tables, summary = {}, {}
    for name, d in zip(names, run_dirs):
        rows = run_rows(d)
        tables[name] = sce_table(rows, family)
        selection = select_from_rows(rows, family, collapse_boundary, metric)
        if selection is not None:
            summary[name] = {"run_dir": str(d), **selection}
    return tables, summary


def markdown_table(summary: Mapping[str, dict]) -> str:
    lines = [
        "| run | checkpoints | max-SCE step | SCE | sce_health | sce_strict | s | g | verdict | first collapse "
        "| guarded step | guarded SCE | guarded verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v: "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    for name, s in summary.items():
        t, c, gd = s["suppression_tradeoff"] or {}, s["first_collapse"] or {}, s.get("guarded") or {}
        cells = (
            name,
            s["num_checkpoints"],
            t.get("step"),
            t.get("sce"),
            t.get("sce_health"),
            t.get("sce_strict"),
            t.get("s"),
            t.get("g"),
            t.get("verdict"),
            c.get("step"),
            gd.get("step"),
            gd.get("sce"),
            s.get("guarded_verdict"),
        )
        lines.append("| " + " | ".join(fmt(v) for v in cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="lightning-unlearn report", description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--out", default="sce_report", help="output directory (default: ./sce_report)")
    ap.add_argument("--names", nargs="*", help="row labels, one per RUN_DIR (default: directory names)")
    ap.add_argument("--family", default="sce", help="metric family holding SCE rows (default: sce)")
    ap.add_argument("--collapse-boundary", type=float, default=0.5, help="degraded rate g marking collapse")
    ap.add_argument(
        "--metric",
        default="sce",
        choices=["sce", "sce_health", "sce_strict"],
        help="SCE variant for selection and the heatmap (default: sce)",
    )
    args = ap.parse_args(argv)
    tables, summary = summarize(args.run_dirs, args.family, args.collapse_boundary, args.names, args.metric)
    if not any(tables.values()):
        raise SystemExit(f"no {args.family!r} rows in {args.run_dirs}; were the runs evaluated with SCEEvaluation?")
    out = Path(args.out)
    fig = sce_heatmap_figure(tables, metric=args.metric)
    save_figure(fig, out / "sce_heatmap.png")
    write_json(out / "summary.json", summary)
    table = markdown_table(summary)
    write_text_atomically(out / "summary.md", table + "\n")
    print(table)
    print(f"\nwrote {out / 'sce_heatmap.png'}, {out / 'summary.json'}, {out / 'summary.md'}")


def mask_auc_main(argv: Sequence[str] | None = None) -> None:
    """``lightning-unlearn mask-auc``: localization AUC of one unlearned model against the forget mask, as JSON."""
    import json

    from lightning_unlearn.masks import group_mask, load_masks, masked_parameter_names, union_mask
    from lightning_unlearn.metrics.mask_auc import mask_auc
    from lightning_unlearn.models import load_weights

    ap = argparse.ArgumentParser(prog="lightning-unlearn mask-auc", description=mask_auc_main.__doc__)
    ap.add_argument("--pre", required=True, help="θ_pre: save_pretrained directory or .safetensors file")
    ap.add_argument("--inj", required=True, help="θ_inj (the injected model unlearning started from)")
    ap.add_argument("--unl", required=True, help="θ_unl (the unlearned model)")
    ap.add_argument("--masks", required=True, help="packed group masks (masks.save_masks)")
    ap.add_argument("--forget-groups", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--retain-groups", type=int, nargs="*", default=[3, 4, 5])
    ap.add_argument("--control-inj", help="UnMask control start weights (enables the contrast families)")
    ap.add_argument("--control-unl", help="UnMask control weights after the same unlearning")
    ap.add_argument("--max-samples", type=int, default=2_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    if (args.control_inj is None) != (args.control_unl is None):
        raise SystemExit("pass both --control-inj and --control-unl (the UnMask control), or neither.")
    packed, _ = load_masks(args.masks)
    unl = load_weights(args.unl)
    if Path(args.unl, "config.json").exists():
        from lightning_unlearn.models import load_causal_lm

        names = [n for n in masked_parameter_names(load_causal_lm(args.unl)) if n in packed]
    else:  # no model to read θ_mask from: parameters with any group element
        names = [n for n, t in packed.items() if bool(group_mask(t, range(32)).any())]
    control = None
    if args.control_inj:
        c_inj, c_unl = load_weights(args.control_inj), load_weights(args.control_unl)
        control = {n: c_unl[n] - c_inj[n] for n in names}
    result = mask_auc(
        load_weights(args.pre),
        load_weights(args.inj),
        unl,
        union_mask(packed, args.forget_groups),
        control=control,
        unified_mask=union_mask(packed, args.forget_groups + args.retain_groups) if args.retain_groups else None,
        names=names,
        max_samples=args.max_samples,
        seed=args.seed,
    )
    text = json.dumps(result, indent=1)
    if args.out:
        write_json(args.out, result)
    print(text)
