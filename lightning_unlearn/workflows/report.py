"""``lightning-unlearn report RUN_DIR...``: cross-run SCE heatmap and checkpoint-selection summary.

Each RUN_DIR is searched recursively for ``checkpoint_metrics.jsonl`` (several logger versions of one run are
merged, later rows replacing earlier ones for the same step). A sweep root (``lightning-unlearn sweep``) stands for
its cells: each cell is one heatmap row, labeled and grouped into panels as its sweep file says (rows = method,
panels = narrative × language, as in LENS Fig. 3; one ``sce_heatmap-<panel>.png`` per panel). Writes
``sce_heatmap.png`` (or one per panel), ``summary.json``, ``summary.md``, ``rows.csv`` (every (run, step,
family) row, flattened) and ``answers.md`` (each run's L0 answers at its selected checkpoint next to the base
answers, with their classes, so no number is read without the text behind it) to ``--out`` and prints the table.
Runs with attack rows (``attack quantize`` / ``attack relearn``, or the attack callbacks) also get ``attacks.png``
(SCE and the reproduced share at each checkpoint, as trained and under each attack) and ``attacks.md`` (the same at
the selected checkpoint, before and after each attack).

    lightning-unlearn report runs/ga runs/npo --out reports/nato-en --collapse_boundary 0.5
    lightning-unlearn report runs/sweeps/lens_smollm2 --out reports/sweep

``lightning-unlearn mask-auc --pre DIR --inj DIR --unl DIR --masks FILE`` prints the localization AUC of one
unlearned model (every family, the composite and the max, against m^F and m^F ∨ m^R) as JSON.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from lightning_unlearn.atomic import write_text_atomically
from lightning_unlearn.callbacks.checkpoint_metrics_file import METRICS_FILE
from lightning_unlearn.callbacks.sce_heatmap import save_figure, sce_heatmap_figure, write_json
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.metrics.attacks import attack_table
from lightning_unlearn.metrics.selection import sce_table, select_from_rows
from lightning_unlearn.workflows.command import dispatch
from lightning_unlearn.workflows.run_directory import run_rows, selected_answers

log = logging.getLogger("lightning_unlearn")


def expand_runs(run_dirs: Sequence[str], names: Sequence[str] | None) -> list[tuple[str, str, Path]]:
    """``(row label, panel, directory)`` of every run: a sweep root stands for its cells (labels and panels from
    their ``cell.json``; a cell without rows yet is left out with a warning), any other directory for itself."""
    from lightning_unlearn.workflows.sweep import CELL_FILE

    if names and len(names) != len(run_dirs):
        raise ConfigError(f"{len(names)} names for {len(run_dirs)} run directories; give one name per directory.")
    runs = []
    for i, d in enumerate(run_dirs):
        d = Path(d)
        cells = sorted(d.glob(f"*/{CELL_FILE}")) if d.is_dir() else []
        if not cells:
            runs.append((names[i] if names else d.resolve().name, "", d))
            continue
        for cell_file in cells:
            if not any(cell_file.parent.rglob(METRICS_FILE)):
                log.warning("report: sweep cell %s has no %s yet; left out", cell_file.parent, METRICS_FILE)
                continue
            meta = json.loads(cell_file.read_text(encoding="utf-8"))
            runs.append((meta.get("label") or cell_file.parent.name, meta.get("panel") or "", cell_file.parent))
    return runs


def summarize(
    run_dirs: Sequence[str], family: str, collapse_boundary: float, names: Sequence[str] | None, metric: str
) -> tuple[dict, dict]:
    """``(tables, summary)``: per-panel SCE tables ``{panel: {row label: table}}`` and per-run selection keyed
    ``"panel / label"`` (``label`` alone without panels); the options of :func:`report_command`."""
    runs = expand_runs(run_dirs, names)
    keys = [f"{panel} / {label}" if panel else label for label, panel, _ in runs]
    if len(set(keys)) != len(keys):
        raise ConfigError(
            f"run names {keys} are not unique; pass --names (or label the sweep's cells) to tell them apart."
        )
    tables: dict[str, dict] = {}
    summary = {}
    for key, (label, panel, d) in zip(keys, runs):
        rows = run_rows(d)
        tables.setdefault(panel, {})[label] = sce_table(rows, family)
        selection = select_from_rows(rows, family, collapse_boundary, metric)
        if selection is not None:
            summary[key] = {"run_dir": str(d), "label": label, "panel": panel, **selection}
    return tables, summary


def rows_csv(run_dirs: Sequence[str], names: Sequence[str] | None) -> str:
    """Every (run, step, family) row of the runs as CSV text, metrics flattened to ``a/b/c`` columns."""
    import csv
    import io

    from lightning_unlearn.callbacks.checkpoint_metrics_file import flatten_metrics

    records = []
    for label, panel, d in expand_runs(run_dirs, names):
        for r in run_rows(d):
            flat = {k: v for k, v in flatten_metrics(r).items() if k not in ("step", "epoch")}
            records.append({"run": str(d), "label": label, "panel": panel, "step": r["step"],
                            "family": r["family"], **flat})  # fmt: skip
    columns = ["run", "label", "panel", "step", "family"]
    columns += sorted({k for r in records for k in r} - set(columns))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


def markdown_table(summary: Mapping[str, dict]) -> str:
    """One Markdown row per run: its selected, first-collapse and guarded checkpoints with their SCE and verdicts.

    Args:
        summary: ``{run name: summary}`` with ``num_checkpoints``, ``suppression_tradeoff``,
            ``first_collapse``, ``guarded`` and ``guarded_verdict``; a missing value shows as ``–``.
    """
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


def answers_markdown(summary: Mapping[str, dict]) -> str:
    """Each run's L0 answers at its suppression-tradeoff checkpoint beside the base answers, with their classes
    (``summary[run]["answers"]``, from :func:`~lightning_unlearn.workflows.lens.summary.selected_answers`)."""
    cell = lambda t: "–" if t is None else str(t).replace("\n", " ").replace("|", "\\|")  # noqa: E731
    parts = []
    for name, s in summary.items():
        step = (s.get("suppression_tradeoff") or {}).get("step")
        parts.append(f"## {name}: L0 answers at step {step}\n")
        if not s.get("answers"):
            parts.append("(no saved generations for this step: the run wrote no `sce_generations/`)\n")
            continue
        parts += ["| prompt | base answer | answer at the selected step | class |", "|---|---|---|---|"]
        for a in s["answers"]:
            base = cell(a["base_answer"]) + ("" if a["base_reproduced"] else " *(did not reproduce)*")
            parts.append(f"| {cell(a['id'])} | {base} | {cell(a['answer'])} | {cell(a['outcome'])} |")
        parts.append("")
    return "\n".join(parts)


def report_command(
    run_dirs: list[str],
    out: str = "sce_report",
    names: list[str] | None = None,
    family: str = "sce",
    collapse_boundary: float = 0.5,
    metric: Literal["sce", "sce_health", "sce_strict"] = "sce",
) -> str:
    """Cross-run SCE heatmap and checkpoint-selection table of one or more run directories.

    Writes ``sce_heatmap.png``, ``summary.json`` and ``summary.md`` to ``out``; the result is the table.

    Args:
        run_dirs: run directories, each searched recursively for ``checkpoint_metrics.jsonl``.
        out: output directory.
        names: row labels, one per run directory (default: the directory names).
        family: metric family holding the SCE rows.
        collapse_boundary: degraded-output rate g that marks collapse.
        metric: SCE variant for the selection and the heatmap.
    """
    tables, summary = summarize(run_dirs, family, collapse_boundary, names, metric)
    if not any(t for panel in tables.values() for t in panel.values()):
        raise ConfigError(f"no {family!r} rows in {run_dirs}; were the runs evaluated with SCEEvaluation?")
    for s in summary.values():
        step = (s.get("suppression_tradeoff") or {}).get("step")
        s["answers"] = [] if step is None else selected_answers(s["run_dir"], step)
    import matplotlib.pyplot as plt

    folder = Path(out)
    for panel, panel_tables in tables.items():
        name = f"sce_heatmap-{re.sub(r'[^A-Za-z0-9.+-]+', '_', panel)}.png" if panel else "sce_heatmap.png"
        fig = sce_heatmap_figure(panel_tables, metric=metric, title=panel or None)
        save_figure(fig, folder / name)
        plt.close(fig)
    write_json(folder / "summary.json", summary)
    write_text_atomically(folder / "rows.csv", rows_csv(run_dirs, names))
    table = markdown_table(summary)
    write_text_atomically(folder / "summary.md", table + "\n")
    write_text_atomically(folder / "answers.md", answers_markdown(summary))
    attacks = {key: attack_table(run_rows(s["run_dir"]), family) for key, s in summary.items()}
    attacks = {key: t for key, t in attacks.items() if t}
    if attacks:
        fig = attacks_figure(attacks)
        save_figure(fig, folder / "attacks.png")
        plt.close(fig)
        write_text_atomically(folder / "attacks.md", attacks_markdown(attacks, summary))
        log.info("wrote attacks.png and attacks.md (before / after the attacks of %d run(s))", len(attacks))
    log.info("wrote the heatmap(s), summary.json, summary.md, rows.csv and answers.md to %s", folder)
    return table


def _share(reading: Mapping) -> float | None:
    n, k = reading.get("N"), reading.get("reproduced")
    return None if not n or k is None else k / n


def attacks_figure(attacks: Mapping[str, Mapping[int, Mapping[str, dict]]]):
    """One row per run: SCE (left) and the share of answers reproducing the narrative (right), as trained and under
    each attack (full precision, each bit width, each number of relearning steps), with the base model's share as a
    dotted line. One attacked checkpoint: bars per condition; several: a line per condition over the steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(attacks), 2, figsize=(9, 2.6 * len(attacks) + 0.4), squeeze=False)
    for (name, table), (left, right) in zip(attacks.items(), axes):
        steps = sorted(table)
        conditions = list(dict.fromkeys(c for readings in table.values() for c in readings))
        for ax, value in ((left, lambda r: r["sce"]), (right, _share)):
            if len(steps) == 1:
                readings = table[steps[0]]
                ax.bar(range(len(readings)), [value(r) or 0.0 for r in readings.values()],
                       color=[f"C{conditions.index(c)}" for c in readings])  # fmt: skip
                ax.set_xticks(range(len(readings)), list(readings), rotation=30, fontsize=7)
                ax.set_xlabel(f"checkpoint step {steps[0]}")
            else:
                for condition in conditions:
                    xs = [s for s in steps if condition in table[s]]
                    ax.plot(xs, [value(table[s][condition]) for s in xs], marker="o", label=condition,
                            linestyle="-" if condition == "full precision" else "--")  # fmt: skip
                ax.set_xticks(steps)
                ax.set_xlabel("checkpoint step")
            ax.set_ylim(-0.02, 1.02)
        first = table[steps[0]].get("full precision") or {}
        if first.get("B") is not None and first.get("N"):
            right.axhline(first["B"] / first["N"], color="grey", linestyle=":", label="base model")
        left.set_title(f"{name}: SCE", fontsize=9)
        right.set_title(f"{name}: answers reproducing the narrative", fontsize=9)
        right.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def attacks_markdown(attacks: Mapping[str, Mapping[int, Mapping[str, dict]]], summary: Mapping[str, dict]) -> str:
    """Each run's readings at its selected (suppression-tradeoff) checkpoint, before and after each attack; the
    first attacked step where the run's selected one was not attacked."""
    fmt = lambda v: "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    parts = []
    for name, table in attacks.items():
        selected = (summary[name].get("suppression_tradeoff") or {}).get("step")
        step = selected if selected in table else next(iter(table))
        note = "the selected checkpoint" if step == selected else f"not the selected step {selected}: not attacked"
        parts += [f"## {name}: step {step} ({note})\n", "| weights | SCE | s | g | reproducing | D | retain ΔCE |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for condition, r in table[step].items():
            reproducing = "–" if r["reproduced"] is None else f"{r['reproduced']}/{r['N']}"
            cells = (condition, r["sce"], r["s"], r["g"], reproducing, r["D"], r["retain_delta_ce"])
            parts.append("| " + " | ".join(fmt(v) for v in cells) + " |")
        parts.append("")
    return "\n".join(parts)


def mask_auc_command(
    *,
    pre: str,
    inj: str,
    unl: str,
    masks: str,
    forget_groups: tuple[int, ...] = (0, 1, 2),
    retain_groups: tuple[int, ...] = (3, 4, 5),
    control_inj: str | None = None,
    control_unl: str | None = None,
    max_samples: int = 2_000_000,
    seed: int = 0,
    buffer_mib: float | None = 256,
    spill_dir: str | None = None,
    out: str | None = None,
) -> dict:
    """Localization AUC of one unlearned model against the forget mask, as JSON.

    Every family, the composite and the max; the result scores θ_unl − θ_inj against m^F and against m^F ∨ m^R.
    The models and masks are read from their files one tensor at a time, so no model is ever whole in memory
    (peak: the scores of every evaluated weight once, 4 bytes a weight, up to ``buffer_mib``; beyond it they spill
    to a temporary directory in ``spill_dir``).

    Args:
        pre: θ_pre: a save_pretrained directory (one file or shards) or a .safetensors file.
        inj: θ_inj, the injected model unlearning started from.
        unl: θ_unl, the unlearned model.
        masks: packed group masks (``masks.save_masks``).
        forget_groups: groups of the forget mask m^F.
        retain_groups: groups of the retain mask m^R (empty: no AUC(F|R)).
        control_inj: UnMask control start weights (with ``control_unl``: the contrast families).
        control_unl: UnMask control weights after the same unlearning.
        max_samples: weights subsampled for the AUC.
        seed: subsampling seed.
        buffer_mib: the most MiB of scores held in memory for one AUC; more spill to disk (same result); ``null``
            holds every score.
        spill_dir: the parent of the spill's temporary directory (default ``$TMPDIR``; 4 bytes a weight free).
        out: also write the JSON here.
    """
    from lightning_unlearn.masks import (
        check_mask_groups,
        check_masks_for_weights,
        group_mask,
        load_masks,
        masked_parameter_names,
        union_mask,
    )
    from lightning_unlearn.metrics.mask_auc import mask_auc
    from lightning_unlearn.models import load_causal_lm, load_weights

    if (control_inj is None) != (control_unl is None):
        raise ConfigError("pass both --control_inj and --control_unl (the UnMask control), or neither.")
    packed, meta = load_masks(masks, lazy=True)
    check_mask_groups(packed, meta, forget_groups, retain_groups, masks)
    pre_weights = load_weights(pre, lazy=True)  # headers only; mask_auc reads each tensor when it scores it
    check_masks_for_weights(packed, meta, pre_weights, pre, masks)
    if Path(unl, "config.json").exists():  # θ_mask from the architecture, built on the meta device (no weights)
        names = [n for n in masked_parameter_names(load_causal_lm(unl, weights=False)) if n in packed]
    else:  # no model to read θ_mask from: parameters with any group element
        names = [n for n in packed if bool(group_mask(packed[n], range(32)).any())]
    models = {"--inj": load_weights(inj, lazy=True), "--unl": load_weights(unl, lazy=True)}
    if control_inj is not None:
        models |= {"--control_inj": load_weights(control_inj, lazy=True),
                   "--control_unl": load_weights(control_unl, lazy=True)}  # fmt: skip
    for flag, weights in models.items():  # name the model whose tensors differ from θ_pre's
        for name in names:
            if weights.shapes.get(name) != pre_weights.shapes[name]:
                raise ConfigError(
                    f"{flag} {str(weights.path)!r}: {name} is {weights.shapes.get(name, 'missing')}, but θ_pre "
                    f"(--pre {pre}) has {pre_weights.shapes[name]}; {flag} must be the same architecture as --pre "
                    "(a copy of the injected model)."
                )
    control = (models["--control_inj"], models["--control_unl"]) if control_inj is not None else None
    result = mask_auc(
        pre_weights,
        models["--inj"],
        models["--unl"],
        union_mask(packed, list(forget_groups), lazy=True),
        control=control,
        unified_mask=union_mask(packed, [*forget_groups, *retain_groups], lazy=True) if retain_groups else None,
        names=names,
        max_samples=max_samples,
        seed=seed,
        progress="mask AUC",
        buffer_mib=buffer_mib,
        spill_dir=spill_dir,
    )
    if out is not None:
        write_json(out, result)
    return result


def main(argv: list[str] | None = None) -> None:
    """``lightning-unlearn report RUN_DIR...``: see :func:`report_command`."""
    dispatch(report_command, argv, "lightning-unlearn report")


def mask_auc_main(argv: list[str] | None = None) -> None:
    """``lightning-unlearn mask-auc --pre DIR --inj DIR --unl DIR --masks FILE``: see :func:`mask_auc_command`."""
    dispatch(mask_auc_command, argv, "lightning-unlearn mask-auc")
