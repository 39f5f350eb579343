"""Localization precision at every checkpoint (Lacuna App. E): mask AUC of the weight change vs the forget mask."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.distributed import broadcast_object, full_parameters, world
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.masks import check_mask_groups, load_masks, masked_parameter_names, union_mask
from lightning_unlearn.metrics.mask_auc import buffer_bytes, mask_auc
from lightning_unlearn.models import load_weights


class MaskAUCEvaluation(CheckpointEvaluator):
    """Every scoring family's ROC AUC and the max, against m^F and the unified m^F ∨ m^R.

    All ranks gather the full parameters (FSDP shards included, one tensor at a time); rank 0 scores them and
    broadcasts the result. Per-family AUCs are exact over all of θ_mask; the composite uses a subsample.

    Args:
        pre_path: θ_pre weights (``.safetensors`` file or ``save_pretrained`` directory).
        inj_path: θ_inj weights (the injected model unlearning starts from).
        masks_path: packed group masks (``masks.save_masks``).
        forget_groups: group ids of m^F (paper G_1–G_3 = ids 0–2).
        retain_groups: group ids of m^R (ids 3–5); empty skips the unified AUC(F|R).
        control_inj_path: the UnMask control's start weights; with ``control_unl_path`` enables the contrast
            families (Δ_unmask = control_unl − control_inj).
        control_unl_path: the UnMask control's weights after the same unlearning.
        max_samples: weights subsampled for the composite classifier.
        composite: fit the composite classifier.
        buffer_mib: the most MiB of scores rank 0 holds for one AUC; more spill to ``spill_dir`` (same result).
        spill_dir: the parent of the spill's temporary directory (default ``$TMPDIR``; 4 bytes a weight free).
        name: see :class:`CheckpointEvaluator`.
        output_dir: see :class:`CheckpointEvaluator`.

    Raises:
        ValueError: only one of the two control paths, a ``buffer_mib`` that is not positive, or group ids
            the masks lack.
        FileNotFoundError: one of the weight or mask paths does not exist.

    Example::

        >>> from lightning_unlearn.callbacks import MaskAUCEvaluation
        >>> paths = ("pre.safetensors", "inj.safetensors", "masks.safetensors")
        >>> MaskAUCEvaluation(*paths, control_inj_path="ctl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_unlearn.errors.ConfigError: pass both control_inj_path and control_unl_path (the UnMask ...
    """

    family = "mask_auc"

    def __init__(
        self,
        pre_path: str,
        inj_path: str,
        masks_path: str,
        forget_groups: Sequence[int] = (0, 1, 2),
        retain_groups: Sequence[int] = (3, 4, 5),
        control_inj_path: str | None = None,
        control_unl_path: str | None = None,
        max_samples: int = 2_000_000,
        composite: bool = True,
        buffer_mib: float | None = 256,
        spill_dir: str | None = None,
        name: str | None = None,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(name=name, output_dir=output_dir)
        if (control_inj_path is None) != (control_unl_path is None):
            raise ConfigError("pass both control_inj_path and control_unl_path (the UnMask control), or neither.")
        for what, p in (
            ("pre_path", pre_path),
            ("inj_path", inj_path),
            ("masks_path", masks_path),
            ("control_inj_path", control_inj_path),
            ("control_unl_path", control_unl_path),
        ):
            if p is not None and not Path(p).exists():
                raise MissingPathError(f"{what}={p!r} does not exist.")
        self.pre_path, self.inj_path, self.masks_path = pre_path, inj_path, masks_path
        self.forget_groups, self.retain_groups = list(forget_groups), list(retain_groups)
        self.control_paths = (control_inj_path, control_unl_path) if control_inj_path else None
        self.max_samples = max_samples
        self.composite = composite
        buffer_bytes(buffer_mib)  # a bad size fails here, not at the first checkpoint
        self.buffer_mib, self.spill_dir = buffer_mib, spill_dir
        # before any training: groups the masks lack would score AUC(F|R) as AUC(F), or fail at the first checkpoint
        check_mask_groups(*load_masks(masks_path, lazy=True), self.forget_groups, self.retain_groups, masks_path,
                          ("forget_groups", "retain_groups"))  # fmt: skip
        self._reference: dict | None = None

    def _load_reference(self) -> dict:
        """θ_pre, θ_inj, the label masks and the control as lazy views of their files: ``mask_auc`` reads each tensor
        when it scores it (as ``lightning-unlearn mask-auc`` does), so rank 0 holds no model beside the one it
        evaluates. Only the headers are read here, once."""
        if self._reference is None:
            packed, _ = load_masks(self.masks_path, lazy=True)
            groups = self.forget_groups + self.retain_groups
            control = self.control_paths and tuple(load_weights(p, lazy=True) for p in self.control_paths)
            self._reference = {
                "pre": load_weights(self.pre_path, lazy=True),
                "inj": load_weights(self.inj_path, lazy=True),
                "forget": union_mask(packed, self.forget_groups, lazy=True),
                "unified": union_mask(packed, groups, lazy=True) if self.retain_groups else None,
                "control": control or None,
            }
        return self._reference

    @override
    def compute(self, trainer: Trainer, pl_module: LightningModule, step: int) -> dict:
        """Collective: each scoring family's AUC of the weight change θ_unl − θ_inj against m^F (and m^F ∨ m^R).

        Every rank gathers the full parameters; rank 0 scores them against the lazily read θ_pre, θ_inj and masks
        and broadcasts the row. NaN AUCs (no positive or no negative weight) become ``None``; ``|`` in keys
        becomes ``_or_``.

        Args:
            trainer: the trainer.
            pl_module: the module whose ``model`` holds θ_unl (full fine-tuning, no adapter).
            step: the checkpoint's step.

        Returns:
            :func:`~lightning_unlearn.metrics.mask_auc.mask_auc`'s result, the same on every rank.

        Raises:
            ValueError: the model carries a peft adapter (mask AUC scores full-parameter changes).
        """
        model = pl_module.model
        if hasattr(model, "disable_adapter"):
            raise ConfigError(
                "MaskAUCEvaluation scores full-parameter weight changes; the model carries a peft adapter. "
                "Evaluate mask AUC on full fine-tuning runs (Lacuna's unlearning setting)."
            )
        names = masked_parameter_names(model)
        rank, _ = world()
        theta_unl = {}
        for name, tensor in full_parameters(model):  # collective: every rank gathers each shard in turn
            if rank == 0 and name in names:
                theta_unl[name] = tensor
        result = None
        if rank == 0:
            ref = self._load_reference()
            result = mask_auc(
                ref["pre"],
                ref["inj"],
                theta_unl,
                ref["forget"],
                control=ref["control"],
                unified_mask=ref["unified"],
                names=names,
                max_samples=self.max_samples,
                composite=self.composite,
                progress=self.progress,
                buffer_mib=self.buffer_mib,
                spill_dir=self.spill_dir,
            )
            result["num_positive"] = {k.replace("|", "_or_"): v for k, v in result["num_positive"].items()}
            result = {k.replace("|", "_or_"): v for k, v in result.items()}
            for key in ("F", "F_or_R"):
                if key in result:
                    result[key] = {
                        f: (None if isinstance(v, float) and math.isnan(v) else v) for f, v in result[key].items()
                    }
        return broadcast_object(result)
