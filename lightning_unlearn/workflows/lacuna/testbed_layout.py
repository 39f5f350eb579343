"""Where a Lacuna testbed work directory keeps its artifacts: θ_pre, the masks, the data, the models unlearning
starts from. Below the localization report and the retain reference, which both read a testbed.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning_unlearn.errors import MissingPathError


def testbed_paths(workdir: str | os.PathLike) -> dict[str, Path | None]:
    """The artifacts of a testbed work directory; raises naming what is missing and how to make it."""
    w = Path(workdir)
    paths: dict[str, Path | None] = {
        "pre": w / "inject" / "export" / "pre",
        "masks": w / "inject" / "export" / "masks.safetensors",
        "data": w / "data",
    }
    for key, path in paths.items():
        if not path.exists():
            raise MissingPathError(
                f"testbed {key} {str(path)!r} does not exist; build the testbed first "
                f"(`lightning-unlearn lacuna run --workdir {w}`)."
            )
    # Unlearning starts from the instruction-tuned model; a testbed without that stage starts from θ_inj (the
    # instruction LoRA lives in the last two blocks, outside θ_mask, so the scored weights are the same).
    paths["start"] = _first(w / "instruct" / "export" / "model", w / "inject" / "export" / "inj")
    paths["control_start"] = _first(
        w / "instruct_unmasked" / "export" / "model", w / "inject_unmasked" / "export" / "inj", required=False
    )
    return paths


def _first(*candidates: Path, required: bool = True) -> Path | None:
    for c in candidates:
        if c.exists():
            return c
    if required:
        raise MissingPathError(f"none of {[str(c) for c in candidates]} exists; build the testbed first.")
    return None


__all__ = ["testbed_paths"]
