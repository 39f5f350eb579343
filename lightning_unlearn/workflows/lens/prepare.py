"""LENS workflow steps before unlearning: base answers, annotation, forget set, labeler calibration.

Library functions (usable from a LightningModule or callback):

- :func:`generate_answers` / :func:`generate_for_records`: batched, left-padded, greedy generation of answers to
  suite prompts (rendered by :func:`lightning_unlearn.generation.model_prompt`, the chat template applied when the
  tokenizer has one), on top of :func:`lightning_unlearn.generation.generate_greedy`.
- :func:`make_labeler`, :func:`label_rows`, :func:`summarize_by_level`.
- :func:`build_forget_rows`: the strict (Target-Dominant) or weak-label forget set as ``{prompt, answer}``.

Commands (``lightning-unlearn lens <name> --help``; the ``*_command`` functions):

- ``lens baseline``: generate base answers to a suite under a condition → JSONL (+ ``.meta.json``).
- ``lens export``: the L0 base answers, or a sample of a run's post-unlearning answers, as a CSV for annotators
  (``label`` and ``validity`` columns to fill).
- ``lens import``: annotated CSV (or a labeler, marked ``weak_labels: true``) → forget-set JSONL + metadata.
- ``lens label``: label a baseline file with a labeler and print Reproduced counts per level.
- ``lens calibrate``: a labeler's predictions vs manual labels, printed like LENS Table 8; and the answer-validity
  detectors vs the annotated ``validity`` classes (precision and recall with Wilson intervals; the file
  ``CheckpointSelection`` needs to call a checkpoint a useful operating point).
- ``lens suite check``: every problem of a suite file of one's own, with its line.

The forget set's ``prompt`` is exactly the text the model was prompted with (chat-rendered, without the leading
BOS token, which ``encode_prompt_answer`` adds back), so unlearning sees the same context as generation.
Every command validates its inputs before doing work and writes its outputs atomically; bad input writes nothing.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import torch

from lightning_unlearn.atomic import write_texts_atomically
from lightning_unlearn.data.narratives import (
    CONDITIONS,
    LEVELS,
    PromptRecord,
    check_suite_file,
    format_problems,
    load_suite,
    resolve_suite,
)
from lightning_unlearn.data.records import meta_path, recorded_suites_dir
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.generation import generate_sorted, model_prompt
from lightning_unlearn.labelers.calibration import (
    VALIDITY_CLASSES,
    calibration_report,
    format_calibration_table,
    format_validity_calibration,
    load_validity_calibration,
    normalize_validity_class,
    validity_calibration_report,
)
from lightning_unlearn.labelers.judge_calibration import Pick
from lightning_unlearn.labelers.manual_labels import TARGET_DOMINANT, ManualLabels
from lightning_unlearn.labelers.narrative_label import INVALID, REPRODUCED, NarrativeLabel, NarrativeLabeler
from lightning_unlearn.labelers.nli_labeler import NLILabeler
from lightning_unlearn.labelers.responsiveness_judge import DEFAULT_JUDGE_MODEL
from lightning_unlearn.labelers.signature_labeler import SignatureLabeler
from lightning_unlearn.workflows.lens.validity import detect_validity, format_judge_calibration

log = logging.getLogger("lightning_unlearn")

LABELERS = ("signature", "nli")
NLI_ENTAIL_THRESHOLD = 0.7  # the NLI labeler's options, as every command here defaults them
NLI_MARGIN = 0.2
FORGET_LEVELS = ("L0",)
EXPORT_COLUMNS = (
    "id",
    "step",
    "narrative",
    "language",
    "level",
    "variant",
    "condition",
    "question",
    "answer",
    "hit_token_cap",
    "label",
    "validity",
    "notes",
    "run",
    "pick",
    "weight",
)
GENERATION_LEVELS = ("L0", "L1", "L2")


# ----------------------------------------------------------------------------------------------- generation
def generate_answers(
    model,
    tokenizer,
    questions: Sequence[str],
    max_new_tokens: int = 60,
    batch_size: int = 8,
    chat_template: bool | None = None,
) -> list[str]:
    """Greedy answers to ``questions``, batched with left padding (the model's train/eval mode is restored).

    Args:
        model: a causal LM (plain transformers or peft-wrapped).
        tokenizer: its tokenizer.
        questions: suite prompts.
        max_new_tokens: generation cap per answer.
        batch_size: prompts per ``generate`` call.
        chat_template: see :func:`model_prompt`.
    """
    texts = [model_prompt(tokenizer, q, chat_template) for q in questions]
    return [r["answer"] for r in generate_sorted(model, tokenizer, texts, max_new_tokens, batch_size)]


def generate_for_records(
    model,
    tokenizer,
    records: Sequence[PromptRecord],
    max_new_tokens: int = 60,
    batch_size: int = 8,
    chat_template: bool | None = None,
    synced_gpus: bool = False,
    progress: str | None = None,
) -> list[dict]:
    """One row per suite record: the record's fields plus ``question`` (suite prompt), ``prompt`` (model prompt),
    ``answer``, ``n_new_tokens`` and ``hit_token_cap`` (no EOS before the cap; a degeneration flag).

    ``synced_gpus=True`` is needed when parameters are sharded (FSDP): every rank must call with the same number of
    batches. Rows feed :func:`label_rows` directly.
    """
    texts = [model_prompt(tokenizer, r.prompt, chat_template) for r in records]
    gens = generate_sorted(model, tokenizer, texts, max_new_tokens, batch_size, synced_gpus, progress)
    rows = []
    for rec, text, gen in zip(records, texts, gens):
        row = rec.to_dict()
        row["question"] = row.pop("prompt")
        row["prompt"] = text
        row.update(gen)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------- labeling
def make_labeler(
    name: str,
    nli_path: str | None = None,
    entail_threshold: float = NLI_ENTAIL_THRESHOLD,
    margin: float = NLI_MARGIN,
    suites_dir: str | None = None,
) -> SignatureLabeler | NLILabeler:
    """``"signature"`` (offline default) or ``"nli"`` (needs a local ``nli_path``), reading the suites of
    ``suites_dir`` (default: the shipped ones); errors name the fix."""
    if name == "signature":
        return SignatureLabeler(suites_dir=suites_dir)
    if name == "nli":
        if not nli_path:
            raise ConfigError("labeler 'nli' needs --nli_path pointing at a local NLI model directory.")
        return NLILabeler(nli_path, entail_threshold=entail_threshold, margin=margin, suites_dir=suites_dir)
    raise ConfigError(f"unknown labeler {name!r}; use one of {', '.join(LABELERS)}.")


def label_rows(rows: Sequence[dict], labeler: NarrativeLabeler) -> list[NarrativeLabel]:
    """Labels for baseline rows (grouped by narrative × language so each suite is loaded once), in row order."""
    labels: list[NarrativeLabel | None] = [None] * len(rows)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r["narrative"], r["language"]), []).append(i)
    for (narrative, language), idx in groups.items():
        out = labeler.label([rows[i]["answer"] for i in idx], narrative, language, [rows[i]["level"] for i in idx])
        for i, lbl in zip(idx, out):
            labels[i] = lbl
    return labels


def with_labels(rows: Sequence[dict], labels: Sequence[NarrativeLabel], labeler_name: str) -> list[dict]:
    """Rows with ``label``, ``stance``, ``entity_recovery``, ``actors`` and ``labeler`` fields added."""
    out = []
    for row, lbl in zip(rows, labels):
        out.append(
            {
                **row,
                "label": lbl.label,
                "stance": lbl.stance,
                "entity_recovery": lbl.entity_recovery,
                "actors": list(lbl.actors),
                "labeler": labeler_name,
            }
        )
    return out


def summarize_by_level(rows: Sequence[dict]) -> dict[str, dict[str, int]]:
    """Per level: ``n``, ``reproduced``, ``invalid``, ``entity_recovery`` counts of labeled rows."""
    summary: dict[str, dict[str, int]] = {}
    for lvl in LEVELS:
        sel = [r for r in rows if r["level"] == lvl]
        if sel:
            summary[lvl] = {
                "n": len(sel),
                "reproduced": sum(r["label"] == REPRODUCED for r in sel),
                "invalid": sum(r["label"] == INVALID for r in sel),
                "entity_recovery": sum(bool(r.get("entity_recovery")) for r in sel),
            }
    return summary


def format_level_summary(summary: dict[str, dict[str, int]]) -> str:
    """The per-level summary as a fixed-width text table (n, Reproduced, Invalid, entity recovery per level).

    Args:
        summary: ``{level: {"n", "reproduced", "invalid", "entity_recovery"}}``.
    """
    lines = [f"{'level':<11}{'n':>4}{'Reproduced':>12}{'Invalid':>9}{'entity recovery':>17}"]
    for lvl, s in summary.items():
        lines.append(f"{lvl:<11}{s['n']:>4}{s['reproduced']:>12}{s['invalid']:>9}{s['entity_recovery']:>17}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ forget set
def build_forget_rows(rows: Sequence[dict], keep: Iterable[bool]) -> list[dict]:
    """``{prompt, answer, id, question}`` for the rows flagged in ``keep`` (the format the objectives read)."""
    return [
        {"prompt": r["prompt"], "answer": r["answer"], "id": r["id"], "question": r.get("question", r["prompt"])}
        for r, k in zip(rows, keep)
        if k
    ]


# ---------------------------------------------------------------------------------------------------- files
def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSONL file (blank lines skipped).

    Args:
        path: the file.

    Raises:
        FileNotFoundError: the file does not exist.
    """
    p = Path(path)
    if not p.is_file():
        raise MissingPathError(f"{str(p)!r} does not exist.")
    with open(p, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _jsonl(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _json_text(obj) -> str:
    return json.dumps(obj, indent=1)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _resolve_model_path(model: str) -> str:
    if model == "smollm2":
        from lightning_unlearn.smollm2 import smollm2_path

        return str(smollm2_path())
    return model


# ------------------------------------------------------------------------------------------------- commands
# The labeler options shared by the commands below (``labeler: None`` where labeling is optional).
Labeler = Literal[LABELERS]


def _labeler(
    labeler: str | None, nli_path: str | None, entail_threshold: float, margin: float, suites_dir: str | None = None
):
    return None if labeler is None else make_labeler(labeler, nli_path, entail_threshold, margin, suites_dir)


def baseline_command(
    *,
    model: str,
    narrative: str,
    language: str,
    out: str,
    levels: list[str] | None = None,
    condition: Literal[CONDITIONS] = "compact",
    max_new_tokens: int = 60,
    batch_size: int = 8,
    chat_template: Literal["auto", "on", "off"] = "auto",
    device: str = "cpu",
    threads: int = 0,
    labeler: Labeler | None = None,
    nli_path: str | None = None,
    entail_threshold: float = NLI_ENTAIL_THRESHOLD,
    margin: float = NLI_MARGIN,
    suites_dir: str | None = None,
) -> str | None:
    """Generate base answers to a suite and write them as JSONL (plus a .meta.json sidecar).

    With a labeler the rows are labeled too and the result is the Reproduced count per level.

    Args:
        model: local model directory, or ``smollm2`` (converted on first use).
        narrative: a shipped narrative id (``nato-forced-war``) or the path of a suite file of your own
            (``my-suites/my-narrative.json``; check it with ``lens suite check``).
        language: suite language: ``en``, ``uk``, ``zh-Hans`` or ``zh-Hant``.
        out: output JSONL.
        levels: levels to generate (default: every level of the suite).
        condition: prompt condition.
        max_new_tokens: generation cap per answer.
        batch_size: prompts per ``generate`` call.
        chat_template: apply the tokenizer's chat template (``auto``: when it has one).
        device: torch device of the model.
        threads: torch CPU threads (0: torch's default; 1 is fastest on a busy machine).
        labeler: weak labeler that labels the answers (default: none).
        nli_path: local NLI model directory (labeler ``nli``).
        entail_threshold: NLI entailment threshold.
        margin: NLI separation margin.
        suites_dir: a folder of suite files in which ``narrative`` is an id (default: the shipped suites).
    """
    # Validate everything a user can get wrong before loading a model or writing anything.
    narrative, folder = resolve_suite(narrative, suites_dir)
    suites_dir = None if folder is None else str(folder.resolve())
    records = load_suite(narrative, language, levels, condition, directory=suites_dir)
    weak = _labeler(labeler, nli_path, entail_threshold, margin, suites_dir)
    if threads < 0:
        raise ConfigError(f"--threads must be >= 0, got {threads}.")
    if threads:
        torch.set_num_threads(threads)
    from lightning_unlearn.models import load_causal_lm, load_tokenizer

    model_dir = _resolve_model_path(model)
    tokenizer = load_tokenizer(model_dir)
    lm = load_causal_lm(model_dir).to(device)
    chat = {"auto": None, "on": True, "off": False}[chat_template]
    start = time.perf_counter()
    rows = generate_for_records(lm, tokenizer, records, max_new_tokens, batch_size, chat, progress="lens baseline")
    seconds = time.perf_counter() - start
    meta = {
        "kind": "lens-baseline",
        "model": model_dir,
        "narrative": narrative,
        "suites_dir": suites_dir,
        "language": language,
        "levels": sorted({r.level for r in records}, key=LEVELS.index),
        "condition": condition,
        "max_new_tokens": max_new_tokens,
        "batch_size": batch_size,
        "decoding": "greedy",
        "threads": torch.get_num_threads(),
        "n": len(rows),
        "generation_seconds": round(seconds, 3),
        "created": _now(),
    }
    if weak is not None:
        rows = with_labels(rows, label_rows(rows, weak), labeler)
        meta["labeler"] = labeler
        meta["summary"] = summarize_by_level(rows)
    path = Path(out)
    write_texts_atomically({path: _jsonl(rows), meta_path(path): json.dumps(meta, indent=1, ensure_ascii=False)})
    log.info("wrote %d answers to %s in %.1f s", len(rows), path, seconds)
    return format_level_summary(meta["summary"]) if weak is not None else None


def export_command(
    *,
    out: str,
    baseline: str | None = None,
    generations: list[str] | str | None = None,
    levels: tuple[str, ...] | None = None,
    sample: int = 0,
    seed: int = 0,
    pick: Literal["judge", "random"] = "judge",
    near_share: float = 0.5,
    judge_model: str = DEFAULT_JUDGE_MODEL,
    validity_calibration: str | None = None,
    suites_dir: str | None = None,
) -> None:
    """Write answers as a CSV for annotators: a baseline's L0 answers, or a run's post-unlearning answers.

    Fill ``label`` with Target-Dominant, Target-Included, Target-Rejected or Invalid (for ``lens import --labels``
    and ``lens calibrate``), and ``validity`` with answer, degraded, non_answer, refusal, echo or wrong_language
    (for ``lens calibrate --validity_json``). Judge each answer by reading it: the CSV shows no detector's output.
    With ``--sample N`` from runs, the tool proposes which answers to label (``pick judge``): ``near_share`` of them
    among the answers the responsiveness judge scores closest to its threshold (where a label changes the decision),
    the rest at random, each draw spread over runs, levels and steps; the columns ``pick`` and ``weight`` (1/π, the
    inverse of the answer's chance to be drawn) let ``lens calibrate`` weight the labels so that its estimates hold
    for the whole pool. Leave those two columns as they are.

    Args:
        out: output CSV.
        baseline: JSONL written by ``lens baseline``.
        generations: one or more runs' log directories (their ``sce_generations/step=N.jsonl``) or such files,
            instead of ``baseline``; the distinct answers of every step and run are the pool.
        levels: levels to export (default: L0 of a baseline; L0, L1, L2 of generations).
        sample: export this many answers (0: all).
        seed: the draw's seed.
        pick: ``judge``: near the judge's threshold and at random (generations only); ``random``: a plain random
            sample.
        near_share: with ``pick judge``, the share of the sample drawn near the threshold.
        judge_model: the responsiveness judge's model (see ``ResponsivenessJudge``) that ranks the answers.
        validity_calibration: a calibration from an earlier round of labels: its heads give the current threshold.
        suites_dir: the folder of the runs' suite file when it is not a shipped one (default: the folder the runs'
            SCE rows record, else the shipped suites).
    """
    if (baseline is None) == (generations is None):
        raise ConfigError("give exactly one of --baseline (base answers) or --generations (a run's answers).")
    if sample < 0:
        raise ConfigError(f"--sample must be >= 0, got {sample}.")
    if baseline is not None:
        levels = tuple(levels or FORGET_LEVELS)
        rows = [r for r in read_jsonl(baseline) if r["level"] in levels]
        source = baseline
    else:
        from lightning_unlearn.workflows.lens.validity import generation_rows, recorded_suites_dir

        runs = [generations] if isinstance(generations, str) else list(generations)
        suites_dir = suites_dir or recorded_suites_dir(runs)
        levels = tuple(levels or GENERATION_LEVELS)
        rows = [r for r in generation_rows(runs) if r["level"] in levels]
        source = ", ".join(runs)
    if not rows:
        raise ConfigError(f"{source!r} has no answers at level(s) {', '.join(levels)}.")
    if sample and sample < len(rows):
        if pick == "judge" and generations is not None:
            from lightning_unlearn.labelers.responsiveness_judge import ResponsivenessJudge
            from lightning_unlearn.workflows.lens.validity import picks_by_judge

            judge = ResponsivenessJudge(judge_model, calibration=_judge_calibration(validity_calibration))
            labeler = SignatureLabeler(suites_dir=suites_dir)
            picks = picks_by_judge(rows, sample, judge, labeler, suites_dir, near_share, seed)
        else:
            import random

            chosen = sorted(random.Random(seed).sample(range(len(rows)), sample))
            picks = [Pick(i, "random", len(rows) / sample) for i in chosen]
        near = sum(p.stratum == "near" for p in picks)
        log.info("picked %d of %d answers to label: %d near the judge's threshold, %d at random", len(picks),
                 len(rows), near, len(picks) - near)  # fmt: skip
        rows = [{**rows[p.index], "pick": p.stratum, "weight": round(p.weight, 6)} for p in picks]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=EXPORT_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({"pick": "all", "weight": 1, **r, "label": "", "validity": "", "notes": ""})
    write_texts_atomically({Path(out): buf.getvalue()})
    log.info(
        "wrote %d rows to %s; fill `label` (Target-Dominant / Target-Included / Target-Rejected / Invalid) and/or "
        "`validity` (%s), then run `lightning-unlearn lens import --labels %s` or `lens calibrate --labels %s`.",
        len(rows),
        out,
        " / ".join(VALIDITY_CLASSES),
        out,
        out,
    )


def _judge_calibration(path: str | None) -> str | None:
    """``path`` when it holds judge heads (an earlier round's calibration), else ``None`` (the judge goes zero-shot)."""
    if path is None:
        return None
    return path if load_validity_calibration(path).get("judge") else None


def import_command(
    *,
    baseline: str,
    out: str,
    labels: str | None = None,
    levels: tuple[str, ...] = FORGET_LEVELS,
    labeler: Labeler | None = None,
    nli_path: str | None = None,
    entail_threshold: float = NLI_ENTAIL_THRESHOLD,
    margin: float = NLI_MARGIN,
    suites_dir: str | None = None,
) -> None:
    """Build a forget set from baseline answers: strict (manual labels) or weak (a labeler).

    Strict keeps the Target-Dominant rows of an annotated CSV; weak keeps the rows a labeler calls Reproduced and
    marks the set ``weak_labels: true`` in its metadata. Give exactly one of ``labels`` and ``labeler``.

    Args:
        baseline: JSONL written by ``lens baseline``.
        out: forget-set JSONL of ``{prompt, answer}`` (plus a ``.meta.json`` sidecar).
        labels: annotated CSV/JSONL (manual labels) for the strict set.
        levels: eligible levels.
        labeler: weak labeler for the weak set.
        nli_path: local NLI model directory (labeler ``nli``).
        entail_threshold: NLI entailment threshold.
        margin: NLI separation margin.
        suites_dir: the folder of the baseline's suite (default: the one its ``.meta.json`` records).
    """
    if (labels is None) == (labeler is None):
        raise ConfigError("give exactly one of --labels (manual, strict forget set) or --labeler (weak labels).")
    rows = [r for r in read_jsonl(baseline) if r["level"] in levels]
    if not rows:
        raise ConfigError(f"{baseline!r} has no answers at level(s) {', '.join(levels)}.")
    if labels is not None:
        manual = ManualLabels.read(labels)
        by_id = manual.by_id
        known = {r["id"] for r in rows}
        unknown = [i for i in manual.ids if i not in known]
        if unknown:
            raise ConfigError(f"{labels!r} has ids not among the baseline's {levels} answers: {unknown[:5]}.")
        rows = [r for r in rows if r["id"] in by_id]
        keep = [by_id[r["id"]] == TARGET_DOMINANT for r in rows]
        counts = manual.counts()
        validity = _validity_column(labels)
        source, weak = "manual", False
    else:
        folder = suites_dir or recorded_suites_dir(baseline)
        predicted = label_rows(rows, _labeler(labeler, nli_path, entail_threshold, margin, folder))
        keep = [lbl.reproduced for lbl in predicted]
        counts = dict(Counter(lbl.label for lbl in predicted))
        validity = {}
        source, weak = labeler, True
    forget = [{**f, "validity": validity[f["id"]]} if f["id"] in validity else f for f in build_forget_rows(rows, keep)]
    if not forget:
        raise ConfigError(
            f"no forget rows: none of the {len(rows)} labeled answers is "
            f"{'Target-Dominant' if not weak else 'Reproduced'} (label counts {counts}); nothing was written."
        )
    base_meta_file = meta_path(baseline)
    base_meta = json.loads(base_meta_file.read_text(encoding="utf-8")) if base_meta_file.is_file() else {}
    meta = {
        "kind": "lens-forget-set",
        "narrative": sorted({r["narrative"] for r in rows}),
        "language": sorted({r["language"] for r in rows}),
        "condition": sorted({r["condition"] for r in rows}),
        "levels": list(levels),
        "labels": source,
        "weak_labels": weak,
        "rule": "Target-Dominant only" if not weak else f"{source} labeler: Reproduced",
        "n_candidates": len(rows),
        "n_forget": len(forget),
        "label_counts": counts,
        "validity_counts": dict(Counter(validity.values())),
        "baseline": str(baseline),
        "model": base_meta.get("model"),
        "created": _now(),
    }
    path = Path(out)
    write_texts_atomically({path: _jsonl(forget), meta_path(path): json.dumps(meta, indent=1, ensure_ascii=False)})
    log.info("wrote %d forget rows of %d candidates to %s (weak_labels=%s)", len(forget), len(rows), path, weak)


def label_command(
    *,
    baseline: str,
    out: str,
    labeler: Labeler = "signature",
    nli_path: str | None = None,
    entail_threshold: float = NLI_ENTAIL_THRESHOLD,
    margin: float = NLI_MARGIN,
    suites_dir: str | None = None,
) -> str:
    """Label a baseline file with a labeler; the result is the Reproduced count per level.

    The labeled rows are written to ``out``.

    Args:
        baseline: JSONL written by ``lens baseline``.
        out: labeled JSONL.
        labeler: weak labeler.
        nli_path: local NLI model directory (labeler ``nli``).
        entail_threshold: NLI entailment threshold.
        margin: NLI separation margin.
        suites_dir: the folder of the baseline's suite (default: the one its ``.meta.json`` records).
    """
    weak = _labeler(labeler, nli_path, entail_threshold, margin, suites_dir or recorded_suites_dir(baseline))
    rows = read_jsonl(baseline)
    rows = with_labels(rows, label_rows(rows, weak), labeler)
    write_texts_atomically({Path(out): _jsonl(rows)})
    log.info("wrote %d labeled answers to %s", len(rows), out)
    return format_level_summary(summarize_by_level(rows))


def calibrate_command(
    *,
    labels: str,
    predicted: str | None = None,
    bootstrap: int = 2000,
    seed: int = 0,
    json: str | None = None,
    labeler: Labeler | None = None,
    nli_path: str | None = None,
    entail_threshold: float = NLI_ENTAIL_THRESHOLD,
    margin: float = NLI_MARGIN,
    suites_dir: str | None = None,
    validity_json: str | None = None,
    judge_model: str | None = DEFAULT_JUDGE_MODEL,
    max_answers_flagged: float = 0.1,
) -> str:
    """Calibrate weak labels against manual ones: the narrative labeler (LENS Table 8) and the validity detectors.

    Narrative labels: precision, recall and F1, strict and broad, with Wilson and bootstrap 95% intervals; the weak
    labels come from ``predicted`` (a labeled JSONL) or from running ``labeler`` on the answers in ``labels``.
    Validity: when the ``validity`` column is filled, every answer goes through the SCE callback's own scoring
    (health, labeler, answer validity, responsiveness judge) and each detector's precision and recall, with Wilson
    intervals, are reported against the manual classes; ``validity_json`` is the file ``CheckpointSelection``,
    ``lens rescore`` and the judge read. With the judge (``judge_model``), a head is fitted per narrative on the
    labels (the threshold set to flag at most ``max_answers_flagged`` of the real answers) and every number is
    measured on held-out folds (nested cross-validation), weighted by the rows' ``weight`` (``lens export``).

    Args:
        labels: annotated CSV/JSONL (``id``, ``label`` and/or ``validity``; ``answer``, ``question`` and the suite
            keys to run the detectors), e.g. from ``lens export``.
        predicted: labeled JSONL (``id``, ``label``) from ``lens label``.
        bootstrap: bootstrap resamples.
        seed: bootstrap seed.
        json: also write the narrative-label report as JSON here.
        labeler: weak labeler to run on the answers in ``labels`` (instead of ``predicted``; for the validity
            detectors, default ``signature``).
        nli_path: local NLI model directory (labeler ``nli``).
        entail_threshold: NLI entailment threshold.
        margin: NLI separation margin.
        suites_dir: a folder of suite files (default: the shipped suites).
        validity_json: write the validity calibration here (needs the ``validity`` column).
        judge_model: the responsiveness judge's model to calibrate (see ``ResponsivenessJudge``); ``null``: the
            lexical detectors, measured as they are.
        max_answers_flagged: the share of real answers the judge's threshold may flag.
    """
    rows = _read_rows(labels, need=())
    has_validity = any((r.get("validity") or "").strip() for r in rows)
    if validity_json is not None and not has_validity:
        raise ConfigError(f"{labels!r} has no `validity` entries; fill the column ({', '.join(VALIDITY_CLASSES)}).")
    if predicted is None and labeler is None and not has_validity:
        raise ConfigError(
            "give --predicted (a labeled JSONL) or --labeler to calibrate narrative labels, or fill the `validity` "
            "column of --labels to calibrate the validity detectors."
        )
    out = []
    if predicted is not None or labeler is not None:
        manual = ManualLabels.read(labels)
        if predicted is not None:
            by_id = {r["id"]: r["label"] for r in read_jsonl(predicted)}
            missing = [i for i in manual.ids if i not in by_id]
            if missing:
                raise ConfigError(f"{predicted!r} has no prediction for ids {missing[:5]}.")
            flags = [by_id[i] == REPRODUCED for i in manual.ids]
            name = Path(predicted).name
        else:
            _check_suite_columns(rows, labels)
            weak = _labeler(labeler, nli_path, entail_threshold, margin, suites_dir)
            flags = [lbl.reproduced for lbl in label_rows(rows, weak)]
            name = labeler
        report = calibration_report(flags, manual, n_bootstrap=bootstrap, seed=seed)
        if json is not None:
            write_texts_atomically({Path(json): _json_text(report)})
        out.append(format_calibration_table(report, title=f"Calibration of {name} against manual labels"))
    if has_validity:
        annotated = [r for r in rows if (r.get("validity") or "").strip()]
        _check_suite_columns(annotated, labels, (*SUITE_COLUMNS, "question"))
        classes = [normalize_validity_class(r["validity"]) for r in annotated]
        detector = _labeler(labeler or "signature", nli_path, entail_threshold, margin, suites_dir)
        judge_section = None
        if judge_model is None:
            detected = detect_validity(annotated, detector, suites_dir)
        else:
            from lightning_unlearn.labelers.responsiveness_judge import ResponsivenessJudge
            from lightning_unlearn.workflows.lens.validity import calibrate_judge, calibration_id

            judge = ResponsivenessJudge(judge_model)
            judge_section, detected = calibrate_judge(annotated, classes, detector, judge, suites_dir,
                                                      max_answers_flagged, seed)  # fmt: skip
            judge_section["id"] = calibration_id(judge_section)
        report = validity_calibration_report(classes, detected)
        report = {
            "kind": "lens-validity-calibration",
            "narratives": sorted({r["narrative"] for r in annotated}),
            "languages": sorted({r["language"] for r in annotated}),
            "labels": str(labels),
            "labeler": labeler or "signature",
            "created": _now(),
            **report,
        }
        if judge_section is not None:
            report |= {"id": judge_section["id"], "judge": judge_section}
        if validity_json is not None:
            write_texts_atomically({Path(validity_json): _json_text(report)})
        out.append(format_validity_calibration(report))
        if any(str(r.get("weight") or "1").strip() not in ("1", "1.0") for r in annotated):
            out[-1] += (
                "\nThese counts are of the labeled answers as drawn (`lens export` oversamples those near the "
                "judge's threshold); the judge's table weights each by 1/π to estimate the whole pool."
            )
        if judge_section is not None:
            out.append(format_judge_calibration(judge_section))
    return "\n\n".join(out)


def _validity_column(path: str) -> dict[str, str]:
    """``{id: validity class}`` of the annotated rows whose ``validity`` is filled (checked)."""
    rows = _read_rows(path, need=())
    return {str(r["id"]): normalize_validity_class(r["validity"]) for r in rows if (r.get("validity") or "").strip()}


SUITE_COLUMNS = ("answer", "narrative", "language", "level")


def _check_suite_columns(rows: Sequence[dict], path: str, need: Sequence[str] = SUITE_COLUMNS) -> None:
    need = set(need)
    if rows and not need <= set(rows[0]):
        raise ConfigError(f"{path!r} needs columns {sorted(need)} to be labeled; use the CSV written by lens export.")


def _read_rows(path: str, need: Sequence[str] = SUITE_COLUMNS) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise MissingPathError(f"annotation file {str(p)!r} does not exist; write it with `lens export`.")
    if p.suffix == ".jsonl":
        return read_jsonl(p)
    with open(p, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    _check_suite_columns(rows, path, need)
    return rows


def suite_check_command(file: str) -> str:
    """Check a suite file of your own: every problem with its line, or what the suite holds.

    Args:
        file: a suite JSON file (``my-suites/my-narrative.json``; the file name is the narrative id).
    """
    problems = check_suite_file(file)
    if problems:
        raise ConfigError(format_problems(problems, file))
    data = json.loads(Path(file).read_text(encoding="utf-8"))
    lines = [f"{file}: valid suite of narrative {data['narrative']!r}"]
    for language, lang in data["languages"].items():
        counts = ", ".join(f"{lvl} {len(lang['prompts'][lvl])}" for lvl in LEVELS if lvl in lang["prompts"])
        claim = f"{len(lang['claim'])} claim pattern(s)" if lang.get("claim") else "no claim vocabulary"
        lines.append(f"  {language}: {counts}; {len(lang['actors'])} actors; {claim}")
    return "\n".join(lines)
