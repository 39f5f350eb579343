"""``lightning-unlearn attack {quantize,relearn} RUN_DIR``: the attacks on a finished run's saved checkpoints.

The run's own evaluators (its ``config.yaml``'s callbacks) run again on each checkpoint's weights rounded to each bit
width (:class:`~lightning_unlearn.callbacks.QuantizationAttack`), or after a few relearning steps from it
(:class:`~lightning_unlearn.callbacks.RelearningAttack`), through ``evaluate``'s machinery: one ``quantization_attack``
or ``relearning_attack`` row per step joins ``checkpoint_metrics.jsonl``, and a second run adds nothing.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import yaml

from lightning_unlearn.atomic import write_text_atomically
from lightning_unlearn.errors import ConfigError

logger = logging.getLogger("lightning_unlearn")


def quantize_command(
    run_dir: Path, *, bits: list[int] | None = None, group_size: int | None = 128, steps: list[int] | None = None
) -> dict:
    """The quantization attack on every saved checkpoint of a run (or ``--steps``); rows added to its metrics file.

    Args:
        run_dir: the run's directory (where its ``checkpoint_metrics.jsonl`` and ``config.yaml`` are).
        bits: bit widths (default ``[8, 4]``): int8 per output channel, narrower widths in groups of ``group_size``.
        group_size: weights of a row sharing one scale below 8 bits (GPTQ / AWQ's 128); ``null``: per channel.
        steps: only these saved steps (default: all).

    Returns:
        ``evaluate``'s result: the steps evaluated and skipped, and the metrics file.
    """
    from lightning_unlearn.callbacks.quantization_attack import QuantizationAttack
    from lightning_unlearn.workflows.evaluate import evaluate_command

    bits = [8, 4] if bits is None else list(bits)
    QuantizationAttack(bits=bits, group_size=group_size)  # a bad width or group size: refused before any model loads
    callback = {"class_path": "lightning_unlearn.callbacks.QuantizationAttack",
                "init_args": {"bits": bits, "group_size": group_size}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="attack-") as folder:
        config = Path(folder) / "quantize.yaml"
        config.write_text(yaml.safe_dump({"trainer": {"callbacks+": [callback]}}), encoding="utf-8")
        return evaluate_command(Path(run_dir), eval_config=[config], steps=steps)


def held_out_records(run_config: Path) -> list[dict]:
    """The default relearning text of a LENS run: the base model's reproductions of the narrative at the levels its
    forget set left out (the forget set is built from some levels, e.g. L0; the L1 answers that reproduce the same
    narrative to other questions are related text the unlearning never saw).

    Raises:
        ValueError: the run's forget set is not a LENS forget set (no ``.meta.json`` of kind ``lens-forget-set`` with
            its baseline), or its baseline holds no reproduction outside the forget set's levels.
    """
    from lightning_unlearn.data.records import read_records

    config = yaml.safe_load(Path(run_config).read_text(encoding="utf-8")) or {}
    forget = ((config.get("data") or {}).get("init_args") or {}).get("forget_path")
    meta_path = Path(str(forget)).with_suffix(".meta.json") if forget else None
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path and meta_path.is_file() else {}
    if meta.get("kind") != "lens-forget-set" or not meta.get("baseline"):
        raise ConfigError(
            f"attack relearn: the run's forget set ({forget}) is not a LENS forget set with a baseline, so there is "
            "no default relearning text; give --records FILE (related text, or the forget set's held-out part; "
            "never the forget set itself)."
        )
    levels = set(meta.get("levels") or [])
    rows = [r for r in read_records(meta["baseline"], what="LENS baseline")
            if r.get("label") == "Reproduced" and r.get("level") not in levels]  # fmt: skip
    if not rows:
        raise ConfigError(
            f"attack relearn: the baseline {meta['baseline']} has no reproduction outside the forget set's levels "
            f"{sorted(levels)}; give --records FILE."
        )
    return [{"prompt": r["prompt"], "answer": r["answer"], "id": r.get("id"), "level": r.get("level")} for r in rows]


def relearn_command(
    run_dir: Path,
    *,
    records: Path | None = None,
    relearn_steps: list[int] | None = None,
    lr: float = 1e-4,
    batch_size: int = 4,
    seed: int = 0,
    steps: list[int] | None = None,
) -> dict:
    """The relearning attack on every saved checkpoint of a run (or ``--steps``); rows added to its metrics file.

    From each checkpoint the trainable weights (a LoRA adapter, or every weight) are trained ``relearn_steps`` steps
    on ``records`` and the run's evaluators run after each number of steps: a recovery curve per checkpoint.

    Args:
        run_dir: the run's directory (where its ``checkpoint_metrics.jsonl`` and ``config.yaml`` are).
        records: ``{prompt, answer}`` records to relearn (a JSONL / JSON / CSV file or a datasets folder). Default,
            for a LENS run: the base model's reproductions at the levels its forget set left out
            (:func:`held_out_records`); other runs must name their file.
        relearn_steps: after how many relearning steps the evaluators run (default ``[10, 30]``).
        lr: AdamW learning rate of the relearning.
        batch_size: records per relearning step.
        seed: the order of the records.
        steps: only these saved steps (default: all).

    Returns:
        ``evaluate``'s result: the steps evaluated and skipped, and the metrics file.

    Raises:
        ValueError: no default records for this run and none given, or a bad step count or learning rate.
    """
    from lightning_unlearn.callbacks.relearning_attack import RelearningAttack
    from lightning_unlearn.workflows.evaluate import evaluate_command

    relearn_steps = [10, 30] if relearn_steps is None else list(relearn_steps)
    run_dir = Path(run_dir).expanduser()
    run_config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) if (
        run_dir / "config.yaml").is_file() else {}  # fmt: skip
    chat = bool((((run_config or {}).get("data") or {}).get("init_args") or {}).get("chat_template", False))
    with tempfile.TemporaryDirectory(prefix="attack-") as folder:
        if records is None:
            rows = held_out_records(run_dir / "config.yaml")
            records = Path(folder) / "relearn.jsonl"
            write_text_atomically(records, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            logger.info("[attack relearn] relearning on %d held-out reproductions of the baseline", len(rows))
        # a bad step list, learning rate or records file: refused before any model loads
        RelearningAttack(str(records), steps=relearn_steps, lr=lr, batch_size=batch_size, seed=seed)
        callback = {"class_path": "lightning_unlearn.callbacks.RelearningAttack",
                    "init_args": {"records": str(Path(records).resolve()), "steps": relearn_steps, "lr": lr,
                                  "batch_size": batch_size, "seed": seed, "chat_template": chat}}  # fmt: skip
        config = Path(folder) / "relearn.yaml"
        config.write_text(yaml.safe_dump({"trainer": {"callbacks+": [callback]}}), encoding="utf-8")
        return evaluate_command(run_dir, eval_config=[config], steps=steps)


def main(argv: list[str] | None = None) -> None:
    """``lightning-unlearn attack {quantize,relearn} RUN_DIR``."""
    from lightning_unlearn.workflows.command import dispatch

    description = (
        "Attacks on a finished run's checkpoints: quantize (its weights rounded to int8 / int4), relearn (a few "
        "fine-tuning steps on related text)."
    )
    dispatch({"quantize": quantize_command, "relearn": relearn_command}, argv, "lightning-unlearn attack", description)
