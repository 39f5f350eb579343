"""Where a Lacuna testbed work directory keeps its artifacts: each stage's root and export, θ_pre, the masks, the
data, the splits, the models unlearning starts from. The chain writes this layout; the localization report and the
retain reference read it. Below all three, so none spells a path by hand.

    <workdir>/data                       the testbed's people, QA and neutral text
    <workdir>/pretrain/export/model      θ_pre when the chain pretrains it
    <workdir>/inject/export/{inj, pre, masks.safetensors}   θ_inj, the θ_pre it started from, the group masks
    <workdir>/inject_unmasked/export/inj the UnMask control
    <workdir>/instruct[_unmasked]/export/model   the instruction-tuned models (when the chain tunes)
    <workdir>/splits                     the memorization-filtered splits
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lightning_unlearn.errors import MissingPathError

EXPORT = "export"


def exported_model(run_root: str | os.PathLike) -> Path:
    """The model a fit in ``run_root`` exports (``<run_root>/export/model``): an instruction tuning, an unlearning
    run of the localization report."""
    return Path(run_root) / EXPORT / "model"


@dataclass(frozen=True)
class TestbedPaths:
    """The layout of one testbed work directory (see the module docstring).

    Args:
        workdir: the work directory.

    Example::

        >>> paths = TestbedPaths("runs/lacuna")
        >>> paths.inj(unmasked=True).as_posix(), paths.masks.as_posix()
        ('runs/lacuna/inject_unmasked/export/inj', 'runs/lacuna/inject/export/masks.safetensors')
    """

    workdir: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "workdir", Path(self.workdir))

    def stage(self, name: str) -> Path:
        """The root of stage ``name`` (``pretrain``, ``inject``, ``instruct_unmasked``, …)."""
        return self.workdir / name

    def export(self, name: str) -> Path:
        """What stage ``name`` exported."""
        return self.stage(name) / EXPORT

    @property
    def data(self) -> Path:
        """The testbed data directory."""
        return self.workdir / "data"

    @property
    def splits(self) -> Path:
        """The memorization-filtered splits."""
        return self.workdir / "splits"

    @property
    def pre_model(self) -> Path:
        """θ_pre as the pretraining stage exports it."""
        return exported_model(self.stage("pretrain"))

    @property
    def pre(self) -> Path:
        """θ_pre as the masked injection recorded it (the weights the masks are measured against)."""
        return self.export("inject") / "pre"

    @property
    def masks(self) -> Path:
        """The packed group masks of the masked injection."""
        return self.export("inject") / "masks.safetensors"

    def inj(self, unmasked: bool = False) -> Path:
        """θ_inj of the masked injection, or of the UnMask control."""
        return self.export("inject_unmasked" if unmasked else "inject") / "inj"

    def instructed(self, unmasked: bool = False) -> Path:
        """The instruction-tuned model of the masked injection, or of the control."""
        return exported_model(self.stage("instruct_unmasked" if unmasked else "instruct"))


def testbed_paths(workdir: str | os.PathLike) -> dict[str, Path | None]:
    """The artifacts of a built testbed that unlearning reads: ``pre``, ``masks``, ``data``, ``start`` (the model
    unlearning starts from) and ``control_start`` (the control's, or ``None``).

    Raises:
        MissingPathError: the testbed lacks one of them (the message says how to build it).
    """
    t = TestbedPaths(Path(workdir))
    paths: dict[str, Path | None] = {"pre": t.pre, "masks": t.masks, "data": t.data}
    for key, path in paths.items():
        if not path.exists():
            raise MissingPathError(
                f"testbed {key} {str(path)!r} does not exist; build the testbed first "
                f"(`lightning-unlearn lacuna run --workdir {t.workdir}`)."
            )
    # Unlearning starts from the instruction-tuned model; a testbed without that stage starts from θ_inj (the
    # instruction LoRA lives in the last two blocks, outside θ_mask, so the scored weights are the same).
    paths["start"] = _first(t.instructed(), t.inj())
    paths["control_start"] = _first(t.instructed(unmasked=True), t.inj(unmasked=True), required=False)
    return paths


def _first(*candidates: Path, required: bool = True) -> Path | None:
    for c in candidates:
        if c.exists():
            return c
    if required:
        raise MissingPathError(f"none of {[str(c) for c in candidates]} exists; build the testbed first.")
    return None


__all__ = ["TestbedPaths", "exported_model", "testbed_paths"]
