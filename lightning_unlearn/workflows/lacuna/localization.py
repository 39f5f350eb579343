"""Localization precision on a Lacuna testbed (Lacuna Sec. 4.3, App. E): OracleGrad vs unrestricted GA and SimNPO.

``lightning-unlearn lacuna localization --workdir DIR`` works on a testbed work directory written by
``lightning-unlearn lacuna run`` (``inject/export/{pre,inj,masks.safetensors}``, ``instruct/export/model``,
``splits/<field>``, and the UnMask control ``instruct_unmasked/export/model``). For every method it

1. unlearns with ``lightning-unlearn fit -c lacuna/<method>.yaml`` (full fine-tuning; OracleGrad's updates
   restricted to m^F by the masked strategy, GA and SimNPO unrestricted) on ``splits/<field>/{forget,retain}``,
2. exports the final weights to ``<out>/<method>/export/model``,
3. scores them with ``lightning-unlearn mask-auc``: every family's AUC against m^F and against m^F ∨ m^R.

GA and SimNPO are also run on the UnMask control (the same unlearning of the unmasked-injection model), which
enables the contrast families; OracleGrad has none (its control is undefined, Lacuna App. E). When the
memorization filter kept no forget or no retain pair for ``field`` (tiny testbeds memorize little), the splits are
rebuilt from all non-instruction profiles (``splits_unfiltered/``) and the summary says so.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from lightning_unlearn.atomic import write_directory_atomically, write_text_atomically
from lightning_unlearn.workflows import processes
from lightning_unlearn.workflows.lacuna.chain import CONFIG_DIR

logger = logging.getLogger("lightning_unlearn")

# method -> (shipped config lacuna/<name>.yaml, restricted to m^F, has an UnMask control run)
METHODS: dict[str, tuple[str, bool, bool]] = {
    "oracle_grad": ("oracle_grad.yaml", True, False),
    "ga": ("ga.yaml", False, True),
    "simnpo": ("simnpo.yaml", False, True),
}
Method = Literal[tuple(METHODS)]
FAMILIES = ("raw", "qtile", "layernorm", "signrev", "reversal", "dirreversal", "contrast", "contrastnorm", "compnorm",
            "composite")  # fmt: skip


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
            raise FileNotFoundError(
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
        raise FileNotFoundError(f"none of {[str(c) for c in candidates]} exists; build the testbed first.")
    return None


def ensure_splits(workdir: str | os.PathLike, field: str, seed: int = 0) -> tuple[Path, bool]:
    """``(splits dir, filtered)``: the memorization-filtered splits when ``field``'s forget and retain are non-empty,
    else splits built from all non-instruction profiles in ``<workdir>/splits_unfiltered``."""
    from datasets import load_from_disk

    from lightning_unlearn.data.splits import build_splits, save_splits
    from lightning_unlearn.data.templates import TARGET_FIELDS
    from lightning_unlearn.data.testbed_data import load_table

    if field not in TARGET_FIELDS:
        raise ValueError(f"field {field!r} is not one of {TARGET_FIELDS}.")
    w = Path(workdir)
    filtered = w / "splits"

    def usable(root: Path) -> bool:
        parts = [root / field / s for s in ("forget", "retain")]
        return all(p.exists() and len(load_from_disk(str(p))) > 0 for p in parts)

    if usable(filtered):
        return filtered, True
    unfiltered = w / "splits_unfiltered"
    if not usable(unfiltered):
        profiles = list(load_table(str(w / "data"), "profiles"))
        everyone = {p["profile_id"] for p in profiles if not p["instruct"]}
        save_splits(unfiltered, build_splits(profiles, {f: everyone for f in TARGET_FIELDS}, seed=seed))
    if not usable(unfiltered):
        raise ValueError(f"the testbed in {str(w)!r} has no forget or no retain profile for {field!r}.")
    return unfiltered, False


def export_checkpoint(ckpt: str | os.PathLike, start_model: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write a full-fine-tuning checkpoint's weights as a ``save_pretrained`` directory (atomically)."""
    import torch

    from lightning_unlearn.models import load_causal_lm, load_tokenizer

    state = torch.load(str(ckpt), map_location="cpu", weights_only=False)["state_dict"]
    model = load_causal_lm(str(start_model))
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    tokenizer = load_tokenizer(str(start_model))

    def write(tmp: Path) -> None:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))

    return write_directory_atomically(out, write)


def fit_command(
    method: str,
    start_model: Path,
    splits: Path,
    field: str,
    out: Path,
    epochs: int,
    masks: Path,
    lr: float | None = None,
    batch_size: int | None = None,
) -> list[str]:
    """The ``lightning-unlearn fit`` arguments of one unlearning run (its overrides file is written to ``out``)."""
    config, restricted, _ = METHODS[method]
    out.mkdir(parents=True, exist_ok=True)
    # One checkpoint, after the last epoch; no logger or progress bar (the run's numbers are the mask AUCs).
    overrides = {
        "trainer": {
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": False,
            "callbacks": [{
                "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                "init_args": {"dirpath": str(out / "checkpoints"), "filename": "final", "every_n_epochs": epochs,
                              "every_n_train_steps": 0,
                              "save_top_k": 1},
            }],
        }
    }  # fmt: skip
    write_text_atomically(out / "overrides.yaml", json.dumps(overrides, indent=1))
    args = [
        "fit", "-c", str(CONFIG_DIR / config), "-c", str(out / "overrides.yaml"),
        "--model.init_args.model_path", str(start_model),
        "--data.init_args.tokenizer_path", str(start_model),
        "--data.init_args.forget_path", str(splits / field),
        "--trainer.max_epochs", str(epochs),
        "--trainer.default_root_dir", str(out),
    ]  # fmt: skip
    if restricted:
        args += ["--model.init_args.masks_path", str(masks)]
    if lr is not None:
        args += ["--model.init_args.optim.lr", str(lr)]
    if batch_size is not None:
        args += ["--data.init_args.batch_size", str(batch_size)]
    return args


def unlearn(args: list[str], out: Path, start_model: Path, in_process: bool, log: Callable[[str], None]) -> Path:
    """Run one ``fit`` (a subprocess with one thread, or in this process) and export its final weights."""
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    log(f"[localization] lightning-unlearn {' '.join(args)}")
    if in_process:
        from lightning_unlearn.cli import main as cli_main

        cli_main(list(args))
    else:
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        env.setdefault("HF_HUB_OFFLINE", "1")
        with open(out / "fit.log", "w") as fh:
            rc = processes.run([sys.executable, "-m", "lightning_unlearn.cli", *args], env=env, stdout=fh,
                               stderr=subprocess.STDOUT)  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"unlearning run failed with exit code {rc}; see {out / 'fit.log'}.")
    ckpt = out / "checkpoints" / "final.ckpt"
    if not ckpt.exists():
        raise RuntimeError(f"the run wrote no {str(ckpt)!r} (did it stop early? see {out / 'fit.log'}).")
    return export_checkpoint(ckpt, start_model, out / "export" / "model")


def score(pre: Path, inj: Path, unl: Path, masks: Path, out: Path, control: tuple[Path, Path] | None = None) -> dict:
    """``lightning-unlearn mask-auc`` on one unlearned model; the JSON is also written to ``out``."""
    from lightning_unlearn.workflows.report import mask_auc_command

    c_inj, c_unl = (str(control[0]), str(control[1])) if control is not None else (None, None)
    mask_auc_command(pre=str(pre), inj=str(inj), unl=str(unl), masks=str(masks), control_inj=c_inj,
                     control_unl=c_unl, out=str(out))  # fmt: skip
    return json.loads(out.read_text())


def run_localization(
    workdir: str | os.PathLike,
    methods: Sequence[str] = tuple(METHODS),
    field: str = "email",
    epochs: int = 50,
    lr: float | None = None,
    batch_size: int | None = None,
    control: bool = True,
    in_process: bool = False,
    out_dir: str | os.PathLike | None = None,
    log: Callable[[str], None] = logger.info,
) -> dict:
    """Unlearn with every method, score the weight change, write ``summary.json``; returns the summary.

    Args:
        workdir: testbed work directory (``lightning-unlearn lacuna run``).
        methods: keys of :data:`METHODS`.
        field: PII field whose splits are unlearned.
        epochs: passes over the forget set (Lacuna: 200).
        lr: learning rate of every method (``None``: each config's, 1e-4).
        batch_size: forget pairs per step (``None``: each config's, 8).
        control: also run GA/SimNPO on the UnMask control for the contrast families (when the testbed has it).
        in_process: run the fits in this process (tests) instead of one single-thread subprocess each.
        out_dir: where runs and the summary go; default ``<workdir>/localization``.
        log: progress lines.
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {sorted(METHODS)}.")
    started = time.time()
    paths = testbed_paths(workdir)
    splits, filtered = ensure_splits(workdir, field)
    if not filtered:
        log(f"[localization] the memorization filter kept no {field} forget/retain pair; using {splits}")
    out_root = Path(out_dir) if out_dir else Path(workdir) / "localization"
    summary: dict = {"workdir": str(workdir), "field": field, "splits": str(splits), "filtered": filtered,
                     "epochs": epochs, "lr": lr, "methods": {}}  # fmt: skip
    for method in methods:
        _, restricted, has_control = METHODS[method]
        out = out_root / method
        args = fit_command(method, paths["start"], splits, field, out, epochs, paths["masks"], lr, batch_size)
        unl = unlearn(args, out, paths["start"], in_process, log)
        ctrl = None
        if control and has_control and paths["control_start"] is not None:
            c_out = out_root / f"{method}_unmask"
            args = fit_command(method, paths["control_start"], splits, field, c_out, epochs, paths["masks"], lr,
                               batch_size)  # fmt: skip
            c_unl = unlearn(args, c_out, paths["control_start"], in_process, log)
            ctrl = (paths["control_start"], c_unl)
        result = score(paths["pre"], paths["start"], unl, paths["masks"], out / "mask_auc.json", ctrl)
        summary["methods"][method] = {"restricted_to_mF": restricted, "control": ctrl is not None, **result}
        log(f"[localization] {method}: AUC(F) max {result['F']['max']:.3f} ({result['F']['best']})")
    summary["seconds"] = round(time.time() - started, 1)
    write_text_atomically(out_root / "summary.json", json.dumps(summary, indent=1))
    return summary


def format_table(summary: dict) -> str:
    """Markdown table: one row per (method, label), a column per family, then the max and the best family."""

    def cell(v) -> str:
        return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

    head = ["method", "label", *FAMILIES, "max", "best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, res in summary["methods"].items():
        for key in ("F", "F|R"):
            if key in res:
                row = [method, key, *(cell(res[key].get(f)) for f in FAMILIES), cell(res[key]["max"]),
                       str(res[key]["best"])]  # fmt: skip
                lines.append("| " + " | ".join(row) + " |")
    warnings = sorted({w for res in summary["methods"].values() for w in res.get("warnings", [])})
    return "\n".join(lines + [f"\nwarning: {w}" for w in warnings])


def localization_command(
    *,
    workdir: str = "runs/lacuna",
    methods: tuple[Method, ...] = tuple(METHODS),
    field: str = "email",
    epochs: int = 50,
    lr: float | None = None,
    batch_size: int | None = None,
    control: bool = True,
    out: str | None = None,
) -> str:
    """Localization precision on a Lacuna testbed: OracleGrad vs GA and SimNPO, by mask AUC.

    Unlearns with every method (OracleGrad restricted to m^F, GA and SimNPO unrestricted), scores each weight
    change against m^F and m^F ∨ m^R, writes ``summary.json`` and returns the table of AUCs per family.

    Args:
        workdir: testbed work directory (``lightning-unlearn lacuna run``).
        methods: the methods to run.
        field: PII field whose splits are unlearned.
        epochs: passes over the forget set (Lacuna: 200).
        lr: learning rate of every method (default: each config's).
        batch_size: forget pairs per step (default: each config's).
        control: also run GA/SimNPO on the UnMask control, for the contrast families (when the testbed has it).
        out: where the runs and the summary go (default: ``<workdir>/localization``).
    """
    with processes.terminate_children_on_exit():  # SIGTERM / SIGHUP end the running fit too
        summary = run_localization(workdir, methods, field, epochs, lr, batch_size, control, out_dir=out)
    kind = "memorization-filtered" if summary["filtered"] else "unfiltered"
    return f"{format_table(summary)}\n\nsplits: {summary['splits']} ({kind}); {summary['seconds']:.0f} s"


__all__ = ["METHODS", "ensure_splits", "export_checkpoint", "format_table", "run_localization", "score"]
