"""``checkpoint_metrics.jsonl``: one row per (checkpoint step, metric family), rewritten atomically."""

from __future__ import annotations

import fcntl
import json
import math
import os
import weakref
from collections.abc import Iterable
from pathlib import Path

from lightning_unlearn.atomic import write_text_atomically

METRICS_FILE = "checkpoint_metrics.jsonl"


def row_key(row: dict) -> tuple[int, str]:
    """The key a metrics row is replaced under: ``(step, family)``.

    Args:
        row: a row of ``checkpoint_metrics.jsonl`` (with ``step`` and ``family``).

    Returns:
        ``(int(row["step"]), str(row["family"]))``.
    """
    return int(row["step"]), str(row["family"])


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a metrics file (empty when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def merge_rows(path: str | os.PathLike, rows: Iterable[dict], drop_from: int | None = None) -> list[dict]:
    """Replace the rows of ``path`` that share a (step, family) key with ``rows``; write temp + ``os.replace``.

    Keyed replacement is what makes resumed runs exact: a checkpoint evaluated before a crash and again after the
    resume appears once, and rows written by other families are kept. ``drop_from``: also remove every row of a
    step ≥ it (the checkpoints a stop rule discarded).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Read, merge and replace under an exclusive lock: two writers (evaluators, a `validate` beside a `fit`) would
    # otherwise each rewrite the file from their own read and drop the other's rows.
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = {row_key(r): r for r in read_rows(path) if drop_from is None or int(r["step"]) < drop_from}
        for r in rows:
            merged[row_key(r)] = _jsonable(r)
        ordered = [merged[k] for k in sorted(merged)]
        write_text_atomically(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered))
    return ordered


def flatten_metrics(metrics: dict, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested dict as ``{"a/b/c": float}`` (bools, strings and None are skipped)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten_metrics(v, key))
        elif isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v)):
            out[key] = float(v)
    return out


RUNS_DIR = "evaluation"  # under default_root_dir, for runs whose loggers keep no versioned directory

# Each trainer's run directory, chosen once (by run_output_dir or use_run_output_dir) and forgotten with the trainer.
_RUN_DIRS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def run_output_dir(trainer) -> Path:
    """The directory of this run's metric rows, selection and heatmap, the same for every callback and rank.

    With a TensorBoard or CSV logger it is the logger's versioned ``trainer.log_dir``. Otherwise (``logger: false``,
    W&B, MLflow, whose ``log_dir`` is a directory every run shares) it is ``<default_root_dir>/evaluation/version_N``,
    a new N per run, so two runs in one directory never merge their rows; a resumed run takes the directory its
    checkpoint's evaluators wrote to. Rank 0 decides, every rank calls it (a collective under DDP/FSDP).
    """
    cached = _RUN_DIRS.get(trainer)
    if cached is not None:
        return cached
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from lightning_unlearn.distributed import broadcast_object, world

    chosen = None
    log_dir = trainer.log_dir  # a collective itself (Lightning broadcasts it): every rank asks
    if world()[0] == 0:
        if any(isinstance(lg, TensorBoardLogger | CSVLogger) for lg in trainer.loggers) and log_dir:
            chosen = str(log_dir)
        else:
            resumed = _resumed_dir(trainer.ckpt_path) if trainer.state.fn == "fit" else None
            chosen = resumed or str(_claim_version(Path(trainer.default_root_dir) / RUNS_DIR))
    path = Path(broadcast_object(chosen))
    _RUN_DIRS[trainer] = path
    return path


def use_run_output_dir(trainer, path: str | os.PathLike) -> None:
    """Make :func:`run_output_dir` return ``path`` for ``trainer`` (every rank must call it alike): the post-hoc
    ``evaluate`` command writes a finished run's rows into that run's own directory."""
    _RUN_DIRS[trainer] = Path(path)


def _resumed_dir(ckpt_path) -> str | None:
    if not ckpt_path or not Path(str(ckpt_path)).is_file():
        return None
    import torch

    try:
        checkpoint = torch.load(str(ckpt_path), map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - the resume itself reports an unreadable checkpoint
        return None
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, dict) and state.get("metrics_path"):
            return str(Path(state["metrics_path"]).parent)
    return None


def _claim_version(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        try:
            (root / f"version_{n}").mkdir()
            return root / f"version_{n}"
        except FileExistsError:
            n += 1
