"""``lightning-unlearn attack quantize RUN_DIR``: the quantization attack on a finished run's saved checkpoints.

The run's own evaluators (its ``config.yaml``'s callbacks) run again on each checkpoint's weights rounded to each bit
width (:class:`~lightning_unlearn.callbacks.QuantizationAttack`), through ``evaluate``'s machinery: one
``quantization_attack`` row per step joins ``checkpoint_metrics.jsonl``, and a second run adds nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml


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


def main(argv: list[str] | None = None) -> None:
    """``lightning-unlearn attack quantize RUN_DIR``."""
    from lightning_unlearn.workflows.command import dispatch

    description = "Attacks on a finished run's checkpoints: quantize (its weights rounded to int8 / int4)."
    dispatch({"quantize": quantize_command}, argv, "lightning-unlearn attack", description)
