"""Re-score a finished (or running) LENS trajectory from its saved generations, without a model.

``SCEEvaluation`` writes every answer of every checkpoint to ``<log_dir>/sce_generations/step=N.jsonl``. This
command labels them again with the current labeler and answer-validity cues, recomputes every SCE variant per level,
replaces the ``sce`` rows of ``checkpoint_metrics.jsonl`` (other families are kept), and rewrites the step files,
``selection.json`` and ``sce_heatmap.png`` — so a new detector, cue, labeler or judge calibration reaches old runs
without regenerating a single answer (the generations are deterministic given the weights, so the result equals a
re-run).
With ``--validity_calibration`` holding judge heads (``lens calibrate``), the responsiveness judge decides with
them, and the selection reads their held-out recall.

    lightning-unlearn lens rescore runs/lens/smollm2/nato-forced-war-en/npo/trajectory
    lightning-unlearn lens rescore RUN_DIR --validity_calibration validity_calibration.json
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from lightning_unlearn.atomic import write_text_atomically
from lightning_unlearn.callbacks.checkpoint_metrics_file import METRICS_FILE, merge_rows, read_rows
from lightning_unlearn.callbacks.checkpoint_selection import HEATMAP_FILE, SELECTION_FILE
from lightning_unlearn.callbacks.sce_evaluation import GENERATIONS_DIR, SCEEvaluation
from lightning_unlearn.callbacks.sce_heatmap import save_figure, sce_heatmap_figure, write_json
from lightning_unlearn.data.records import recorded_suites_dir
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.generation import Generation
from lightning_unlearn.labelers import SignatureLabeler
from lightning_unlearn.labelers.calibration import load_validity_calibration
from lightning_unlearn.labelers.responsiveness_judge import DEFAULT_JUDGE_MODEL, ResponsivenessJudge
from lightning_unlearn.metrics.selection import OperatingPointGuards, sce_table, select_from_rows

log = logging.getLogger("lightning_unlearn")


def _step_files(run_dir: Path) -> dict[int, Path]:
    folder = run_dir / GENERATIONS_DIR
    files = {int(p.stem.removeprefix("step=")): p for p in folder.glob("step=*.jsonl")}
    if not files:
        raise MissingPathError(
            f"no {GENERATIONS_DIR}/step=N.jsonl under {str(run_dir)!r}: re-scoring needs a run evaluated by "
            "SCEEvaluation with this version (it writes every answer of every checkpoint there)."
        )
    return dict(sorted(files.items()))


def _judge(judge_model: str | None, path: str | None, calibration: dict | None) -> ResponsivenessJudge | None:
    """The judge that re-scores: with the calibration's heads when it has them (then a model is required)."""
    heads = path if calibration is not None and calibration.get("judge") else None
    if heads is not None and judge_model is None:
        raise ConfigError(f"{path!r} calibrates the responsiveness judge; give --judge_model (its model: "
                         f"{calibration['judge']['model']!r}), not null.")  # fmt: skip
    return None if judge_model is None else ResponsivenessJudge(judge_model, calibration=heads)


def rescore(
    run_dir: str,
    prompts: str | None = None,
    family: str = "sce",
    collapse_boundary: float = 0.5,
    metric: str = "sce",
    guards: OperatingPointGuards | None = None,
    validity_cues_dir: str | None = None,
    suites_dir: str | None = None,
    validity_calibration: str | None = None,
    min_validity_recall: float = 0.8,
    judge_model: str | None = DEFAULT_JUDGE_MODEL,
) -> dict:
    """Re-label and re-score every saved checkpoint generation of one run; returns the new selection.

    Args:
        run_dir: the run's log directory (holding ``checkpoint_metrics.jsonl`` and ``sce_generations/``).
        prompts: the suite file the run was evaluated on (e.g. its ``baseline.jsonl``), for generation rows that
            predate the ``narrative``/``language`` fields; default: the rows' own fields.
        family: the SCE rows' metric family.
        collapse_boundary: degraded rate marking first collapse.
        metric: selection metric: ``sce``, ``sce_health`` or ``sce_strict``.
        guards: bounds of the guarded selection.
        validity_cues_dir: a folder of per-language answer-validity cue files (default: the shipped ones).
        suites_dir: the folder of the run's suite file when it is not a shipped one (default: the folder the
            run's SCE rows record, else the one the ``--prompts`` file's ``.meta.json`` records, else the shipped
            suites).
        validity_calibration: a ``lens calibrate --validity_json`` file for this narrative (default: none, so no
            checkpoint is verified as a useful operating point); its judge heads, when it has them, decide.
        min_validity_recall: the share of broken answers D must catch for the detectors to count as verified.
        judge_model: the responsiveness judge's model (see ``ResponsivenessJudge``); ``null``: the lexical topic and
            claim cues decide, as before the judge.
    """
    calibration = load_validity_calibration(validity_calibration)
    judge = _judge(judge_model, validity_calibration, calibration)
    root = Path(run_dir)
    if not (root / METRICS_FILE).is_file():
        raise MissingPathError(f"{str(root / METRICS_FILE)!r} does not exist; pass the run's log directory.")
    files = _step_files(root)
    first = [json.loads(line) for line in files[next(iter(files))].read_text(encoding="utf-8").splitlines() if line]
    known = {}
    if prompts is not None:
        known = {str(r["id"]): r for r in (json.loads(x) for x in Path(prompts).read_text().splitlines() if x)}
    records = []
    for o in first:
        extra = known.get(o["id"], {})
        records.append(
            {
                "id": o["id"],
                "level": o["level"],
                "prompt": o["question"],
                "question": extra.get("question") or o["question"],
                "narrative": o.get("narrative") or extra.get("narrative", ""),
                "language": o.get("language") or extra.get("language", "en"),
            }
        )
    unknown = [r["id"] for r in records if not r["narrative"]]
    if unknown:
        raise ConfigError(
            f"the generation rows of {str(root)!r} name no narrative (e.g. {unknown[0]!r}), so they cannot be "
            "labeled; pass --prompts with the suite file the run was evaluated on (its baseline.jsonl)."
        )
    rows = {int(r["step"]): r for r in read_rows(root / METRICS_FILE) if r.get("family") == family}
    if suites_dir is None:
        suites_dir = next((r["suites_dir"] for r in rows.values() if r.get("suites_dir")), None)
    if suites_dir is None and prompts is not None:
        suites_dir = recorded_suites_dir(prompts)
    sce = SCEEvaluation(
        prompts=records,
        labeler=SignatureLabeler(),
        validity_cues_dir=validity_cues_dir,
        suites_dir=suites_dir,
        judge=judge,
    )
    base_answers = [o.get("base_answer") or "" for o in first]
    base = [lab.reproduced for lab in sce._label(sce.records, base_answers)]
    new_rows = []
    for step, path in files.items():
        outs = {o["id"]: o for o in (json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x)}
        missing = [r.id for r in sce.records if r.id not in outs]
        if missing:
            raise ConfigError(f"{path} lacks answers for {missing[:3]}…; it is not from the same suite.")
        gens = [Generation(outs[r.id]["answer"], 0, bool(outs[r.id]["hit_token_cap"])) for r in sce.records]
        labels = sce._label(sce.records, [g.text for g in gens])
        outputs, metrics = sce.score(gens, labels, base, base_answers)
        write_text_atomically(path, "".join(json.dumps(o.to_row(), ensure_ascii=False) + "\n" for o in outputs))
        old = rows.get(step, {"step": step, "family": family})
        new_rows.append({**{k: old[k] for k in ("step", "family", "epoch", "fn", "seconds") if k in old}, **metrics})
        log.info(
            "rescored step %d: sce %.3f (health %.3f, strict %.3f)",
            step,
            metrics["pooled"]["sce"],
            metrics["pooled"]["sce_health"],
            metrics["pooled"]["sce_strict"],
        )
    all_rows = merge_rows(root / METRICS_FILE, new_rows)
    selection = select_from_rows(
        all_rows,
        family,
        collapse_boundary,
        metric,
        guards,
        validity_calibration=calibration,
        min_validity_recall=min_validity_recall,
    )
    write_json(root / SELECTION_FILE, selection)
    fig = sce_heatmap_figure({root.parent.name or "run": sce_table(all_rows, family)}, metric=metric)
    save_figure(fig, root / HEATMAP_FILE)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return selection
