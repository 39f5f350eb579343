"""Answer validity outside a training run: the SCE callback's flags of annotated answers, the judge's calibration
per narrative from them, and the choice of which answers of a run to annotate.

Every decision here is the SCE callback's own (:meth:`SCEEvaluation.score`: health, labeler, answer validity and
the responsiveness judge), so what ``lens calibrate`` measures is what a run reports. The statistics live in
:mod:`lightning_unlearn.labelers.judge_calibration`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from lightning_unlearn.callbacks.checkpoint_metrics_file import METRICS_FILE, read_rows
from lightning_unlearn.callbacks.sce_evaluation import GENERATIONS_DIR, SCEEvaluation
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.generation import Generation
from lightning_unlearn.labelers.calibration import BROKEN_CLASSES
from lightning_unlearn.labelers.judge_calibration import (
    MIN_PER_CLASS,
    Pick,
    cross_validated_heads,
    fit_calibrated_head,
    pick_for_labeling,
    weighted_rate,
)
from lightning_unlearn.labelers.responsiveness_judge import SIMILARITIES, JudgeHead, ResponsivenessJudge

log = logging.getLogger("lightning_unlearn")

# the manual classes the judge's head learns from: real answers against broken ones (refusals and echoes are
# their own detectors' business)
JUDGED_CLASSES = ("answer", *BROKEN_CLASSES)


def _capped(row: dict) -> bool:
    return str(row.get("hit_token_cap", "")).strip().lower() in ("true", "1")


def scorer(rows: Sequence[dict], labeler, suites_dir: str | None = None, judge: ResponsivenessJudge | None = None):
    """An :class:`SCEEvaluation` over ``rows`` (annotated or exported answers: ``id``, ``level``, ``narrative``,
    ``language``, ``question``, ``answer``, optionally ``hit_token_cap`` and ``step``), for scoring them without a
    model."""
    records = [
        {"id": f"{r.get('step', '')}:{r['id']}:{i}", "prompt": r["question"], "question": r["question"],
         "level": r["level"], "narrative": r["narrative"], "language": r["language"]}
        for i, r in enumerate(rows)
    ]  # fmt: skip
    return SCEEvaluation(prompts=records, labeler=labeler, suites_dir=suites_dir, judge=judge)


def detect_validity(
    rows: Sequence[dict], labeler, suites_dir: str | None = None, judge: ResponsivenessJudge | None = None
) -> list[dict]:
    """The SCE callback's per-answer row (health and validity flags, ``degraded_sce``, the judge's reading) of each
    of ``rows`` (see :func:`scorer`)."""
    if not rows:
        return []
    sce = scorer(rows, labeler, suites_dir, judge)
    gens = [Generation(r["answer"], 0, _capped(r)) for r in rows]
    labels = sce._label(sce.records, [g.text for g in gens])
    outputs, _ = sce.score(gens, labels, [False] * len(rows))
    return [o.to_row() for o in outputs]


def _weights(rows: Sequence[dict]) -> np.ndarray:
    """Each row's ``weight`` (1/π from ``lens export``; 1 when absent)."""
    out = []
    for r in rows:
        text = str(r.get("weight") or "").strip()
        try:
            w = float(text) if text else 1.0
        except ValueError:
            raise ConfigError(f"row {r.get('id')!r} has weight {text!r}; it must be a positive number (lens export "
                             "writes it) or empty.") from None  # fmt: skip
        if not w > 0:
            raise ConfigError(f"row {r.get('id')!r} has weight {w}; weights are 1/π, positive.")
        out.append(w)
    return np.asarray(out, dtype=np.float64)


def _heldout(classes: Sequence[str], detected: Sequence[dict], weights: np.ndarray) -> dict:
    """D's recall of broken answers and the share of real answers flagged (in D, refusal or echo), weighted."""
    broken = [i for i, c in enumerate(classes) if c in BROKEN_CLASSES]
    real = [i for i, c in enumerate(classes) if c == "answer"]
    flagged = [bool(detected[i]["degraded_sce"] or detected[i]["refusal"] or detected[i]["echo"]) for i in real]
    return {
        "recall": weighted_rate([bool(detected[i]["degraded_sce"]) for i in broken], weights[broken]),
        "answers_flagged": weighted_rate(flagged, weights[real]),
        "labels": {c: sum(x == c for x in classes) for c in sorted(set(classes))},
    }


def calibrate_judge(
    rows: Sequence[dict],
    classes: Sequence[str],
    labeler,
    judge: ResponsivenessJudge,
    suites_dir: str | None = None,
    max_answers_flagged: float = 0.1,
    seed: int = 0,
) -> tuple[dict, list[dict]]:
    """Fit the judge's head per narrative on annotated answers and measure it on held-out folds.

    Args:
        rows: annotated answers (see :func:`scorer`), optionally with ``weight`` (1/π from ``lens export``).
        classes: each row's manual validity class (normalized).
        labeler: the narrative labeler the run used.
        judge: the judge to calibrate (its model embeds the answers).
        suites_dir: the folder of the rows' suite files when they are not shipped ones.
        max_answers_flagged: the share of real answers the threshold may flag (weighted quantile).
        seed: the folds' seed.

    Returns:
        ``(judge section of the calibration file, held-out detector row of each annotated row)``: each row scored
        by the head of the fold that did not see it (rows the head does not learn from, health-degraded or labeled
        refusal or echo, by the final head).

    Raises:
        ValueError: a narrative with fewer than :data:`MIN_PER_CLASS` labeled real answers or broken answers.
    """
    if not 0 < max_answers_flagged < 1:
        raise ConfigError(f"max_answers_flagged={max_answers_flagged} must be in (0, 1): a share of real answers.")
    weights = _weights(rows)
    sce = scorer(rows, labeler, suites_dir)
    questions = [sce.question_of(r) for r in sce.records]
    inputs = judge.inputs([r["answer"] for r in rows], questions, [sce.hypotheses_of(r) for r in sce.records])
    plain = detect_validity(rows, labeler, suites_dir)  # health flags (no judge needed for them)
    heads: dict[str, JudgeHead] = {}
    fold_of: dict[int, tuple[str, int]] = {}  # row → (narrative, outer fold that held it out)
    fold_heads: dict[tuple[str, int], JudgeHead] = {}
    for narrative in sorted({r["narrative"] for r in rows}):
        idx = np.array([i for i, r in enumerate(rows) if r["narrative"] == narrative and classes[i] in JUDGED_CLASSES
                        and not plain[i]["degraded"]], dtype=int)  # fmt: skip
        is_answer = np.array([classes[i] == "answer" for i in idx], dtype=bool)
        n_real, n_broken = int(is_answer.sum()), int((~is_answer).sum())
        if min(n_real, n_broken) < MIN_PER_CLASS:
            raise ConfigError(
                f"narrative {narrative!r} has {n_real} labeled real answer(s) and {n_broken} broken one(s) that pass "
                f"the health flags; the judge's head needs at least {MIN_PER_CLASS} of each: label more answers "
                "(`lens export --sample N` proposes them)."
            )
        x, w = inputs[idx], weights[idx]
        heads[narrative] = fit_calibrated_head(x, is_answer, w, max_answers_flagged, seed=seed)
        for k, (test, head) in enumerate(cross_validated_heads(x, is_answer, w, max_answers_flagged, seed=seed)):
            fold_heads[(narrative, k)] = head
            fold_of.update({int(i): (narrative, k) for i in idx[test]})
    groups: dict[tuple[str, int] | None, list[int]] = {}
    for i in range(len(rows)):
        groups.setdefault(fold_of.get(i), []).append(i)
    detected: list[dict] = [{}] * len(rows)
    for fold, members in groups.items():
        fold_judge = judge.with_heads(heads if fold is None else {fold[0]: fold_heads[fold]})
        for i, row in zip(members, detect_validity([rows[i] for i in members], labeler, suites_dir, fold_judge)):
            detected[i] = row
    heldout = {
        narrative: _heldout([classes[i] for i in members], [detected[i] for i in members], weights[members])
        for narrative in heads
        for members in [np.array([i for i, r in enumerate(rows) if r["narrative"] == narrative])]
    }
    section = {
        "model": judge.model,
        "fingerprint": judge.fingerprint,
        "inputs": ["embedding", *SIMILARITIES],
        "max_answers_flagged": max_answers_flagged,
        "heads": {n: asdict(h) | {"coef": list(h.coef)} for n, h in heads.items()},
        "heldout": heldout,
    }
    return section, detected


def calibration_id(section: dict) -> str:
    """A short digest of a calibration's judge heads: the generation rows a calibrated judge scores carry it, so a
    selection knows whether the answers were judged with the heads whose held-out recall it reads."""
    text = json.dumps({"fingerprint": section["fingerprint"], "heads": section["heads"]}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def generation_rows(generations: Sequence[str]) -> list[dict]:
    """The distinct answers of one or more runs' ``sce_generations/step=N.jsonl`` files (the first occurrence of
    each answer to each prompt per run, steps in order), each with its ``step`` and ``run`` (the run directory)."""
    rows, seen = [], set()
    for generation in generations:
        path = Path(generation)
        if path.is_dir():
            folder = path / GENERATIONS_DIR if (path / GENERATIONS_DIR).is_dir() else path
            files = sorted(folder.glob("step=*.jsonl"), key=lambda f: int(f.stem.removeprefix("step=")))
        else:
            files = [path] if path.is_file() else []
        if not files:
            raise MissingPathError(
                f"no {GENERATIONS_DIR}/step=N.jsonl at {generation!r}; pass a run's log directory (evaluated by "
                "SCEEvaluation) or one of its step files."
            )
        for f in files:
            step = int(f.stem.removeprefix("step="))
            for line in f.read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                key = (str(generation), row["id"], row["answer"])
                if key not in seen:
                    seen.add(key)
                    rows.append({**row, "step": step, "run": str(generation)})
    return rows


def recorded_suites_dir(generations: Sequence[str]) -> str | None:
    """The suites folder the runs' SCE rows record (``checkpoint_metrics.jsonl`` beside ``sce_generations/``), for
    runs on a suite of one's own; ``None`` when none records one."""
    for generation in generations:
        path = Path(generation)
        run = path if path.is_dir() else path.parent
        run = run.parent if run.name == GENERATIONS_DIR else run
        metrics = run / METRICS_FILE
        if metrics.is_file():
            found = next((r["suites_dir"] for r in read_rows(metrics) if r.get("suites_dir")), None)
            if found:
                return found
    return None


def picks_by_judge(
    rows: Sequence[dict], n: int, judge: ResponsivenessJudge, labeler, suites_dir: str | None = None,
    near_share: float = 0.5, seed: int = 0,
) -> list[Pick]:  # fmt: skip
    """The answers of ``rows`` to label (:func:`~lightning_unlearn.labelers.judge_calibration.pick_for_labeling`),
    near the judge's current threshold (its calibrated head where it has one, else zero-shot) and at random."""
    scored = detect_validity(rows, labeler, suites_dir, judge)
    return pick_for_labeling(
        [s["judge"]["score"] for s in scored],
        [s["judge"]["threshold"] for s in scored],
        [not s["degraded"] for s in scored],
        [(r.get("run", ""), r["level"], int(r.get("step") or 0)) for r in rows],
        n,
        near_share,
        seed,
    )


def format_judge_calibration(section: dict) -> str:
    """A plain-text table of a judge calibration: per narrative, D's recall of broken answers and the share of real
    answers flagged on held-out folds, with their Wilson intervals."""
    lines = [
        f"Responsiveness judge {section['model']!r}, calibrated per narrative (held-out folds, nested "
        f"cross-validation; threshold set to flag at most {section['max_answers_flagged']:.0%} of real answers)",
        f"{'narrative':<28}{'labels':>7}  {'D recall of broken [95% CI]':<30}{'real answers flagged [95% CI]':<30}",
    ]

    def cell(rate: dict) -> str:
        if rate["value"] is None:
            return "–"
        return f"{rate['value']:.3f} [{rate['ci'][0]:.3f}, {rate['ci'][1]:.3f}] ({rate['hits']}/{rate['of']})"

    for narrative, h in section["heldout"].items():
        n = sum(h["labels"].values())
        lines.append(f"{narrative:<28}{n:>7}  {cell(h['recall']):<30}{cell(h['answers_flagged']):<30}")
    lines.append("Broken = degraded, non_answer or wrong_language by hand; flagged = in D, refusal or echo.")
    return "\n".join(lines)
