"""The locality check: which parameters an injection run changed outside a group's mask: ``lightning-unlearn lacuna
locality``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch


def locality_report(export_dir: str, groups: Sequence[int]) -> dict:
    """Count elements that changed between ``pre`` and ``inj`` inside and outside the union of ``groups``."""
    from safetensors.torch import load_file

    from lightning_unlearn.masks import canonical_name, check_masks_for_weights, group_mask, load_masks

    export = Path(export_dir)
    pre = load_file(str(export / "pre" / "model.safetensors"))
    inj = load_file(str(export / "inj" / "model.safetensors"))
    packed, meta = load_masks(export / "masks.safetensors")
    check_masks_for_weights(packed, meta, {canonical_name(k): v for k, v in pre.items()}, export / "pre",
                            export / "masks.safetensors")  # fmt: skip
    inside = outside = 0
    offenders: dict[str, int] = {}
    for name, before in pre.items():
        key = canonical_name(name)
        changed = before != inj[name]
        in_group = group_mask(packed[key], list(groups)) if key in packed else torch.zeros_like(changed)
        inside += int((changed & in_group).sum())
        n_out = int((changed & ~in_group).sum())
        outside += n_out
        if n_out:
            offenders[name] = n_out
    return {"groups": list(groups), "changed_inside": inside, "changed_outside": outside, "offenders": offenders}


def locality_command(*, group: list[int], export: str = "runs/lacuna/inject/export") -> dict:
    """Locality check: count elements an injection changed inside and outside the groups' masks.

    Exits non-zero when any element outside the groups' masks changed.

    Args:
        group: the groups the injection was restricted to.
        export: the injection run's export directory (``pre``, ``inj``, ``masks.safetensors``).
    """
    report = locality_report(export, group)
    if report["changed_outside"]:
        worst = max(report["offenders"], key=report["offenders"].get)
        raise SystemExit(
            f"{report['changed_outside']} elements changed outside groups {group}, in {len(report['offenders'])} "
            f"tensors (most in {worst}: {report['offenders'][worst]})."
        )
    return report


__all__ = ["locality_command", "locality_report"]
