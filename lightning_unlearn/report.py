"""``lightning-unlearn report RUN_DIR...``: cross-run SCE heatmap and checkpoint-selection summary.

Each RUN_DIR is searched recursively for ``checkpoint_metrics.jsonl`` (several logger versions of one run are
merged, later rows replacing earlier ones for the same step). Writes ``sce_heatmap.png``, ``summary.json`` and
``summary.md`` to ``--out`` and prints the table.

    lightning-unlearn report runs/ga runs/npo --out reports/nato-en --collapse-boundary 0.5
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from lightning_unlearn.callbacks.checkpoint_metrics_file import METRICS_FILE, read_rows, row_key
from lightning_unlearn.callbacks.sce_heatmap import save_figure, sce_heatmap_figure, write_json
from lightning_unlearn.metrics.selection import sce_table, select_checkpoints


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


def summarize(run_dirs: Sequence[str], family: str = "sce", collapse_boundary: float = 0.5,
              names: Sequence[str] | None = None) -> tuple[dict, dict]:
    """``(tables, summary)``: per-run SCE tables and per-run selection."""
    names = list(names) if names else [Path(d).resolve().name for d in run_dirs]
    if len(names) != len(run_dirs):
        raise ValueError(f"{len(names)} names for {len(run_dirs)} run directories; give one name per directory.")
    if len(set(names)) != len(names):
        raise ValueError(f"run names {names} are not unique; pass --names to tell the runs apart.")
    tables, summary = {}, {}
    for name, d in zip(names, run_dirs):
        table = sce_table(run_rows(d), family)
        tables[name] = table
        pooled = [{"step": s, **v} for s, v in table.get("pooled", {}).items()]
        summary[name] = {"run_dir": str(d), **select_checkpoints(pooled, collapse_boundary)}
    return tables, summary


def markdown_table(summary: Mapping[str, dict]) -> str:
    lines = ["| run | checkpoints | tradeoff step | SCE | s | g | first collapse step | g at collapse |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    for name, s in summary.items():
        t, c = s["suppression_tradeoff"] or {}, s["first_collapse"] or {}
        lines.append("| " + " | ".join(fmt(v) for v in (name, s["num_checkpoints"], t.get("step"), t.get("sce"),
                                                          t.get("s"), t.get("g"), c.get("step"), c.get("g"))) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="lightning-unlearn report", description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--out", default="sce_report", help="output directory (default: ./sce_report)")
    ap.add_argument("--names", nargs="*", help="row labels, one per RUN_DIR (default: directory names)")
    ap.add_argument("--family", default="sce", help="metric family holding SCE rows (default: sce)")
    ap.add_argument("--collapse-boundary", type=float, default=0.5, help="degraded rate g marking collapse")
    args = ap.parse_args(argv)
    tables, summary = summarize(args.run_dirs, args.family, args.collapse_boundary, args.names)
    if not any(tables.values()):
        raise SystemExit(f"no {args.family!r} rows in {args.run_dirs}; were the runs evaluated with SCEEvaluation?")
    out = Path(args.out)
    fig = sce_heatmap_figure(tables)
    save_figure(fig, out / "sce_heatmap.png")
    write_json(out / "summary.json", summary)
    table = markdown_table(summary)
    (out / "summary.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    print(f"\nwrote {out / 'sce_heatmap.png'}, {out / 'summary.json'}, {out / 'summary.md'}")
