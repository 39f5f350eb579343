"""The testbed's retain reference: ``lightning-unlearn lacuna reference``.

Forget quality and PrivLeak compare the unlearned model with a model never trained on the forget people. On the
Lacuna testbed that model needs no retraining: PII samples update only their group's mask elements (Algorithm 1), so
the start model with m^F's elements set back to θ_pre is the model injected with every group but the forget groups
(θ_mask off m^F keeps the neutral text's and the retain groups' updates; the parameters outside θ_mask — embeddings,
norms, the last two blocks with the instruction adapter — never saw a PII gradient).

That holds exactly only when the groups are separable: the retain groups and the neutral text were injected in the
presence of the forget people's weights, and only a met separability verdict (``lacuna run``: resetting m^F makes the
forget groups forget and only them, utility intact) says that this interaction is negligible. The export refuses a
testbed whose verdict is not met (or was never measured) unless ``allow_inseparable``, and records the verdict in
``<out>/reference.json`` next to the ``save_pretrained`` weights and tokenizer.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from lightning_unlearn.atomic import write_directory_atomically
from lightning_unlearn.data.testbed_data import data_forget_retain_groups
from lightning_unlearn.workflows.lacuna.chain import require_separable
from lightning_unlearn.workflows.lacuna.separability import FORGET_GROUPS, _Reset
from lightning_unlearn.workflows.lacuna.testbed_layout import testbed_paths

logger = logging.getLogger("lightning_unlearn")


def export_reference(
    model_dir: str | os.PathLike,
    pre_dir: str | os.PathLike,
    masks_path: str | os.PathLike,
    out: str | os.PathLike,
    forget_groups: Sequence[int] = FORGET_GROUPS,
    separable: bool | None = None,
) -> Path:
    """Write ``model_dir``'s model with the ``forget_groups``' mask elements set to ``pre_dir``'s weights to ``out``
    (atomically, with ``model_dir``'s tokenizer and a ``reference.json`` recording where it came from)."""
    from lightning_unlearn.masks import load_masks
    from lightning_unlearn.models import load_causal_lm, load_tokenizer, load_weights

    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    packed, _ = load_masks(masks_path, model)
    pre = load_weights(pre_dir)
    record = {
        "model": str(model_dir),
        "pre": str(pre_dir),
        "masks": str(masks_path),
        "reset_groups": sorted(forget_groups),
        "separable": separable,
        "exact": separable is True,
    }

    def write(tmp: Path) -> None:
        with _Reset(model, pre, dict(packed), forget_groups):
            model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / "reference.json").write_text(json.dumps(record, indent=1))

    return write_directory_atomically(out, write)


def ensure_reference(workdir: str | os.PathLike, allow_inseparable: bool = False) -> Path:
    """``<workdir>/reference``, exported from the testbed's start model when missing or older than it; refuses a
    testbed without a met separability verdict unless ``allow_inseparable``."""
    w = Path(workdir)
    separable = require_separable(
        w,
        allow_inseparable,
        "θ_inj with m^F reset to θ_pre is not known to be a model that never saw the forget people, and forget "
        "quality or PrivLeak against it would measure the testbed's artifacts",
        "export it anyway (reference.json records exact: false)",
    )
    paths = testbed_paths(w)
    forget_groups = data_forget_retain_groups(paths["data"])[0]
    out = w / "reference"
    stamp = out / "reference.json"
    start = paths["start"]
    if stamp.exists() and stamp.stat().st_mtime >= (start / "config.json").stat().st_mtime:
        recorded = json.loads(stamp.read_text())
        if (recorded["model"], recorded["separable"], recorded["reset_groups"]) == (
            str(start), separable, sorted(forget_groups)):  # fmt: skip
            return out
    if out.exists():
        import shutil

        shutil.rmtree(out)
    if separable is not True:
        logger.warning("[lacuna] reference: exporting from a testbed without a met separability verdict: not exact.")
    return export_reference(start, paths["pre"], paths["masks"], out, forget_groups, separable=separable)


def reference_command(*, workdir: str = "runs/lacuna", allow_inseparable: bool = False) -> dict:
    """Export the testbed's retain reference (m^F reset to θ_pre) to <workdir>/reference.

    The start model (instruction-tuned, else θ_inj) with the forget groups' mask elements reset to θ_pre, for
    ``reference_model`` of ``TOFUEvaluation`` and ``MIAEvaluation``; exact only on a separable testbed.

    Args:
        workdir: the testbed work directory (``lightning-unlearn lacuna run``).
        allow_inseparable: export from a testbed whose separability verdict is not met (the reference is then not
            exact: forget quality and PrivLeak against it measure the testbed's artifacts too).
    """
    out = ensure_reference(workdir, allow_inseparable)
    return json.loads((out / "reference.json").read_text()) | {"path": str(out)}


__all__ = ["ensure_reference", "export_reference", "reference_command"]
