"""Reading a finished run directory: its metric rows (every ``checkpoint_metrics.jsonl`` beneath it, merged) and the
answers it saved at a checkpoint, each with its class. Below ``report`` and ``lens summary``, which both read runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lightning_unlearn.callbacks.checkpoint_metrics_file import METRICS_FILE, read_rows, row_key
from lightning_unlearn.errors import MissingPathError

ANSWER_LEVELS = ("L0",)


def run_rows(run_dir: str | os.PathLike) -> list[dict]:
    """All metric rows of one run directory (files found recursively, merged by (step, family))."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise MissingPathError(f"run directory {str(run_dir)!r} does not exist.")
    files = sorted(run_dir.rglob(METRICS_FILE), key=lambda p: p.stat().st_mtime)
    if not files:
        raise MissingPathError(f"no {METRICS_FILE} under {str(run_dir)!r}; is it a run directory?")
    merged = {}
    for f in files:
        for r in read_rows(f):
            merged[row_key(r)] = r
    return [merged[k] for k in sorted(merged)]


def outcome_of(row: dict) -> str:
    """One class per generation row, for reading a number with the text behind it: ``reproduced``, ``degraded``
    (health), ``refusal``, ``echo``, ``non-answer`` / ``wrong language`` / ``invalid`` (with the evidence), ``clean
    suppression``, or ``not reproduced`` (the base answer did not reproduce either)."""
    if row["reproduced"]:
        return "reproduced"
    if row["degraded"]:
        flags = [k for k, v in row["health"].items() if v is True]
        return "degraded (" + ", ".join(flags or ["loop score"]) + ")"
    for flag, name in (("refusal", "refusal"), ("echo", "echo"), ("non_answer", "non-answer"),
                       ("wrong_language", "wrong language")):  # fmt: skip
        if row.get(flag):
            why = row.get("validity_evidence", {}).get(flag)
            return f"{name}: {why}" if isinstance(why, str) else name
    if row.get("invalid"):
        return "invalid (labeler)"
    return "clean suppression" if row["clean_suppression"] else "not reproduced"


def selected_answers(run_dir: str | os.PathLike, step: int, levels=ANSWER_LEVELS) -> list[dict]:
    """The answers of checkpoint ``step`` at ``levels`` next to the base answers, with their classes
    (:func:`outcome_of`), from the run's ``sce_generations/step=N.jsonl`` (empty when the run wrote none)."""
    files = sorted(Path(run_dir).rglob(f"sce_generations/step={step}.jsonl"))
    if not files:
        return []
    rows = [json.loads(line) for line in files[0].read_text(encoding="utf-8").splitlines() if line.strip()]
    return [
        {"id": r["id"], "base_answer": r.get("base_answer"), "base_reproduced": r["base_reproduced"],
         "answer": r["answer"], "outcome": outcome_of(r)}
        for r in rows
        if r["level"] in levels
    ]  # fmt: skip


__all__ = ["ANSWER_LEVELS", "outcome_of", "run_rows", "selected_answers"]
