"""``lightning-unlearn lens run SUITE``: from a suite file (or a shipped narrative) to a verdict, in one command.

The LENS chain of ``scripts/lens_trajectory.sh``: base answers to every level of the suite (compact, greedy,
signature-labeled) → forget set (the L0 answers the labeler calls Reproduced, or with ``labels`` the ones labeled
Target-Dominant by hand) → retain set (the base
model's answers to the demo narrative's prompts) → the narrative's ``trajectory.yaml`` (the shipped
``lens/smollm2_trajectory.yaml`` with this run's paths, sizes and judge) → one LoRA trajectory per method as a sweep
(cells = methods × every narrative prepared beside this one, so a second narrative adds a panel) → the cross-run
report → a summary per cell of this narrative. Outputs are named by the narrative id, the suite file's name:

    OUT = runs/lens/smollm2/<narrative>-<language>/{baseline,forget_weak|forget_strict,retain}.jsonl, trajectory.yaml
    SWEEP_ROOT = runs/lens/smollm2/sweep/<method>-<narrative>-<language>-<digest>/run/trajectory/…, report/

A re-run skips finished cells and resumes interrupted ones (the sweep's rule); ``reuse`` keeps the data sets.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import yaml

from lightning_unlearn.atomic import write_text_atomically
from lightning_unlearn.configs import config_root
from lightning_unlearn.data.narratives import check_suite_file, format_problems, resolve_suite
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.labelers.responsiveness_judge import DEFAULT_JUDGE_MODEL

log = logging.getLogger("lightning_unlearn")

TEMPLATE = "lens/smollm2_trajectory.yaml"
RETAIN_NARRATIVE = "demo-canal-tolls"
# methods whose forget rows need what a weak-label forget set has not (a preferred answer per row)
UNSUITED = {"dpo": "it needs a preferred answer per forget row, which the weak-label forget set has not; use idk_dpo"}


def _callback(config: dict, name: str) -> dict:
    """The ``init_args`` of the template's callback whose class is ``name``."""
    for cb in config["trainer"]["callbacks"]:
        if cb["class_path"].rsplit(".", 1)[-1] == name:
            return cb.setdefault("init_args", {})
    raise ConfigError(f"the trajectory template {TEMPLATE} has no {name} callback.")


def trajectory_config(
    out: Path, forget: Path, max_steps: int, every: int, max_new_tokens: int, judge_model: str | None,
    suites_dir: str | None,
) -> str:  # fmt: skip
    """The narrative's ``trajectory.yaml``: the shipped template with this run's data paths, sizes and judge."""
    config = yaml.safe_load((config_root() / TEMPLATE).read_text(encoding="utf-8"))
    trainer = config["trainer"]
    trainer.update(max_steps=max_steps, default_root_dir=str(out))
    trainer["logger"]["init_args"]["save_dir"] = str(out)
    _callback(config, "StopAwareCheckpoint")["every_n_train_steps"] = every
    sce = _callback(config, "SCEEvaluation")
    sce.update(prompts=str(out / "baseline.jsonl"), max_new_tokens=max_new_tokens)
    if suites_dir is not None:
        sce["suites_dir"] = suites_dir
    if judge_model is None:
        sce.pop("judge", None)
    else:
        sce["judge"] = {"class_path": "lightning_unlearn.labelers.ResponsivenessJudge",
                        "init_args": {"model": judge_model}}  # fmt: skip
    _callback(config, "RetainDriftEvaluation")["records"] = str(out / "retain.jsonl")
    config["data"]["init_args"].update(forget_path=str(forget), retain_path=str(out / "retain.jsonl"))
    header = (f"# written by `lightning-unlearn lens run` from the shipped {TEMPLATE}: one narrative's trajectory "
              "overlay on a method config (lens/<method>.yaml)\n")  # fmt: skip
    return header + yaml.safe_dump(config, sort_keys=False, allow_unicode=True)


def sweep_file(sweep_root: Path, model_dir: str, methods: list[str], cells: list[Path], overrides: dict,
               parallel: int, threads: int) -> str:  # fmt: skip
    """The sweep of the trajectories (the shape of the shipped ``sweeps/lens_smollm2.yaml``): rows = methods, panels =
    every narrative's ``trajectory.yaml`` in ``cells``."""
    spec = {
        "root": str(sweep_root),
        "overrides": {
            "model.init_args.model_path": model_dir,
            "data.init_args.tokenizer_path": model_dir,
            "trainer.logger.init_args.save_dir": "{cell_dir}",
            "trainer.logger.init_args.name": "run",
            **overrides,
        },
        "grid": {"configs": [[f"lens/{m}.yaml"] for m in methods]},
        "cells": [{"configs": [str(t)], "panel": t.parent.name} for t in cells],
        "executor": {"kind": "local", "parallel": parallel, "threads": threads},
    }
    header = f"# written by `lightning-unlearn lens run`; run with: lightning-unlearn sweep -c {sweep_root}.yaml\n"
    return header + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True)


def run_command(
    suite: str,
    *,
    language: str = "en",
    methods: list[str] | None = None,
    out: str | None = None,
    sweep_root: str | None = None,
    model: str = "smollm2",
    judge_model: str | None = DEFAULT_JUDGE_MODEL,
    max_steps: int = 60,
    every: int = 10,
    max_new_tokens: int = 60,
    batch_size: int = 8,
    overrides: dict[str, Any] | None = None,
    labels: str | None = None,
    parallel: int = 1,
    threads: int = 1,
    reuse: bool = False,
) -> str:
    """From a suite file (or a shipped narrative) to a verdict: data, trajectories, report, summaries.

    Args:
        suite: the path of a suite file of your own (``my-narrative.json``; its name is the narrative id) or a
            shipped narrative id.
        language: the suite language.
        methods: shipped method configs ``lens/<method>.yaml`` to run (default ``[npo]``).
        out: the narrative's data folder (default ``runs/lens/smollm2/<narrative>-<language>``).
        sweep_root: the sweep's folder (default ``sweep`` beside ``out``; the sweep file is ``<sweep_root>.yaml``).
        model: local model directory, or ``smollm2`` (converted on first use).
        judge_model: the responsiveness judge's model (see ``ResponsivenessJudge``); ``null``: the lexical cues.
        max_steps: optimizer steps per trajectory.
        every: a checkpoint (and its evaluation) every this many steps.
        max_new_tokens: the generation cap of the base answers and of every checkpoint's answers.
        batch_size: prompts per generation batch of the base answers.
        overrides: further dotted ``fit`` overrides of every cell (``{model.init_args.optim.lr: 5.0e-5}``).
        labels: manual labels of the base L0 answers (a ``lens export --baseline`` CSV with ``label`` filled): the
            strict forget set (Target-Dominant rows, ``forget_strict.jsonl``) instead of the weak-label one.
        parallel: cells at a time.
        threads: torch CPU threads per process.
        reuse: keep the data sets already in ``out`` (default: regenerate them).
    """
    from lightning_unlearn.configs import resolve_config
    from lightning_unlearn.workflows.lens import prepare
    from lightning_unlearn.workflows.lens.summary import summary_command
    from lightning_unlearn.workflows.report import report_command
    from lightning_unlearn.workflows.sweep import sweep_command

    methods = list(methods or ["npo"])
    for m in methods:
        if m in UNSUITED:
            raise ConfigError(f"method {m!r} cannot run on a weak-label forget set: {UNSUITED[m]}.")
        if not Path(resolve_config(f"lens/{m}.yaml")).is_file():
            raise ConfigError(f"unknown method {m!r}: there is no shipped config lens/{m}.yaml.")
    if min(max_steps, every, max_new_tokens, batch_size, parallel, threads) < 1:
        raise ConfigError("max_steps, every, max_new_tokens, batch_size, parallel and threads must be at least 1.")
    if every > max_steps:
        raise ConfigError(f"every={every} > max_steps={max_steps}: no checkpoint would be evaluated.")
    narrative, folder = resolve_suite(suite)
    if folder is not None:  # a file of one's own: every problem, with its line, before any work
        problems = check_suite_file(suite)
        if problems:
            raise ConfigError(format_problems(problems, suite))
        suite = str(Path(suite).resolve())
    suites_dir = None if folder is None else str(Path(folder).resolve())
    data = Path(out or f"runs/lens/smollm2/{narrative}-{language}").resolve()
    root = Path(sweep_root).resolve() if sweep_root else data.parent / "sweep"
    model_dir = prepare._resolve_model_path(model)
    data.mkdir(parents=True, exist_ok=True)
    common = {"model": model_dir, "condition": "compact", "max_new_tokens": max_new_tokens,
              "batch_size": batch_size, "threads": threads}  # fmt: skip
    forget = data / ("forget_weak.jsonl" if labels is None else "forget_strict.jsonl")
    how = {"labeler": "signature"} if labels is None else {"labels": labels}
    steps = [
        ("base answers", data / "baseline.jsonl", lambda path: prepare.baseline_command(
            narrative=suite, language=language, labeler="signature", out=str(path), **common)),
        ("forget set", forget, lambda path: prepare.import_command(
            baseline=str(data / "baseline.jsonl"), out=str(path), **how)),
        ("retain set", data / "retain.jsonl", lambda path: prepare.baseline_command(
            narrative=RETAIN_NARRATIVE, language="en", out=str(path), **common)),
    ]  # fmt: skip
    for what, path, make in steps:
        if reuse and path.is_file():
            log.info("lens run: keeping the %s %s", what, path)
            continue
        log.info("lens run: the %s → %s", what, path)
        make(path)
    trajectory = trajectory_config(data, forget, max_steps, every, max_new_tokens, judge_model, suites_dir)
    write_text_atomically(data / "trajectory.yaml", trajectory)
    # every narrative prepared beside this one keeps its cells (one heatmap panel per narrative × language)
    cells = sorted({*data.parent.glob("*/trajectory.yaml"), data / "trajectory.yaml"})
    sweep_path = root.parent / f"{root.name}.yaml"
    write_text_atomically(sweep_path, sweep_file(root, model_dir, methods, cells, overrides or {}, parallel, threads))
    log.info("lens run: %d method(s) × %d narrative(s) as the sweep %s", len(methods), len(cells), sweep_path)
    sweep_command(sweep_path)  # raises, naming the cells, when one fails
    lines = [report_command([str(root)], out=str(root / "report"))]
    for cell in sorted(p for p in root.iterdir() if (p / "cell.json").is_file()):
        if json.loads((cell / "cell.json").read_text(encoding="utf-8")).get("panel") != data.name:
            continue
        lines += ["", str(cell), summary_command(str(cell / "run" / "trajectory"), str(data / "baseline.jsonl"))]
    return "\n".join(lines)
