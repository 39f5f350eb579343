"""The ``lightning-unlearn`` entry point: LightningCLI for ``fit``/``validate``/``test``/``predict``, plus a
few non-Trainer commands (listed in ``EXTRA_COMMANDS``) dispatched before LightningCLI sees the arguments.
"""

from __future__ import annotations

import importlib
import os
import sys

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

# Non-Trainer subcommands: name -> "module:function"; the function takes the remaining argv list.
EXTRA_COMMANDS: dict[str, str] = {
    "report": "lightning_unlearn.workflows.report:main",
    "mask-auc": "lightning_unlearn.workflows.report:mask_auc_main",
    "lens-baseline": "lightning_unlearn.workflows.lens.prepare:baseline_main",
    "lens-export": "lightning_unlearn.workflows.lens.prepare:export_main",
    "lens-import": "lightning_unlearn.workflows.lens.prepare:import_main",
    "lens-label": "lightning_unlearn.workflows.lens.prepare:label_main",
    "lens-calibrate": "lightning_unlearn.workflows.lens.prepare:calibrate_main",
    "lens-summary": "lightning_unlearn.workflows.lens.summary:main",
    "lens-rescore": "lightning_unlearn.workflows.lens.rescore:main",
    "configs": "lightning_unlearn.workflows.configs:main",
    "smollm2": "lightning_unlearn.smollm2:main",
    "lacuna": "lightning_unlearn.workflows.lacuna.chain:main",
    "lacuna-localization": "lightning_unlearn.workflows.lacuna.localization:main",
}


class UnlearnCLI(LightningCLI):
    """LightningCLI with subclass mode for models and datamodules, so YAML names them by ``class_path``."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        super().__init__(LightningModule, LightningDataModule, *args, **kwargs)


def _print_extra_commands() -> None:
    print("\nOther commands (lightning-unlearn COMMAND --help):")
    for name, target in EXTRA_COMMANDS.items():
        print(f"  {name:<22} {target}")


def _resolve_config_args(argv: list[str]) -> list[str]:
    """``-c NAME`` / ``--config NAME``: a local file as it is, else the shipped config of that name (lens/npo.yaml)."""
    from lightning_unlearn.configs import resolve_config

    out = list(argv)
    for i, arg in enumerate(out):
        if arg in ("-c", "--config") and i + 1 < len(out):
            out[i + 1] = resolve_config(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + resolve_config(arg.split("=", 1)[1])
    return out


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if argv and argv[0] in EXTRA_COMMANDS:
        module, func = EXTRA_COMMANDS[argv[0]].split(":")
        getattr(importlib.import_module(module), func)(argv[1:])
        return
    argv = _resolve_config_args(argv)
    try:
        UnlearnCLI(args=argv if argv != sys.argv[1:] else None)
    finally:
        if argv in ([], ["-h"], ["--help"]):
            _print_extra_commands()


if __name__ == "__main__":
    main()
