"""The Lacuna testbed chain and its non-Trainer steps: ``lightning-unlearn lacuna <command>``.

Commands:

- ``run``: the whole built-in chain in a work directory — pretrain → inject (masked) and the UnMask control →
  instruct (both) → filter (both) — then a table of extraction rates per field, masked vs unmasked. Each stage is
  a ``lightning-unlearn fit -c lacuna/<stage>.yaml`` run with the work directory's paths; a finished
  stage (its export exists) is reused and says so, an interrupted one resumes from its last checkpoint. A stage
  whose recorded recipe (``<stage>/recipe.json``: config text and overrides) differs from this run's, or that is
  older than an input rebuilt after it, is refused rather than reused; one built by other package code (the
  recipe's source digest) is reused with a warning, since changed code defaults are in no config.
  ``--model_path DIR`` (or ``smollm2``) starts both injections from a real model instead of the built-in θ_pre and
  skips pretraining; ``--inject_config FILE`` / ``--instruct_config FILE`` add a YAML overlay to both injections /
  both instruction tunings (e.g. a learning rate). The table shows extraction after instruction tuning and on θ_inj
  before it, so what instruction tuning costs is visible.
- ``filter``: greedy extraction per field on the non-instruction profiles, then the memorization-filtered splits
  (``data/splits.py``) as ``datasets`` directories plus ``extraction.json``.
- ``resurface``: the resurfacing attack — instruction-tune a (unlearned) model on the held-out relearning split,
  then count forget profiles whose PII appears in at least one of K sampled generations.
- ``locality``: which parameters an injection run changed outside a group's mask (the locality check).
- ``data``: build the testbed data directory only.
- ``localization``: localization precision of OracleGrad, GA and SimNPO on a built testbed
  (:mod:`lightning_unlearn.workflows.lacuna.localization`).

Each is a ``*_command`` function below (its signature is the command's options); :func:`main` dispatches them.
Progress goes to the ``lightning_unlearn`` logger, the result to stdout.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import torch

from lightning_unlearn.atomic import write_directory_atomically, write_text_atomically
from lightning_unlearn.checkpoints import latest_checkpoint
from lightning_unlearn.configs import config_root, resolve_config
from lightning_unlearn.data.splits import build_splits, save_splits
from lightning_unlearn.data.templates import TARGET_FIELDS
from lightning_unlearn.data.testbed_data import LacunaDataConfig, build_testbed_data, load_table
from lightning_unlearn.generation import generate
from lightning_unlearn.metrics.memorization import extracted
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.smollm2 import resolve_model_dir
from lightning_unlearn.workflows import processes, recipes
from lightning_unlearn.workflows.lacuna.extraction import extraction_rates
from lightning_unlearn.workflows.lacuna.separability import (
    format_separability,
    separability_report,
    separability_verdict,
    write_report,
)

logger = logging.getLogger("lightning_unlearn")

CONFIG_DIR = config_root() / "lacuna"
# Whether `lacuna run` builds the UnMask control by default.
CONTROL_BY_DEFAULT = False
# Why the default chain has no instruction stage (`--instruct true` adds it).
NO_INSTRUCT_REASON = (
    "The injected QA already use the probe's wording, so θ_inj answers the probes itself, and validated on held-out "
    "profiles no instruction adapter beats the untrained model (docs/lacuna_memorization.md §1): the stage kept θ_inj "
    "unchanged. The splits are built from θ_inj; --instruct true runs the stage (and builds them from its model)."
)

# Overrides of the YAML defaults per size preset. "default" is the built-in main job (2 CPU cores, ≤ 15 min):
# θ_pre derived from SmolLM2 (pretrain.yaml). "tiny" is for tests (seconds): a random tiny θ_pre
# (pretrain_tiny.yaml).
SIZES: dict[str, dict[str, list[str]]] = {
    "default": {"pretrain": [], "inject": [], "instruct": []},
    "tiny": {
        "pretrain_config": ["pretrain_tiny.yaml"],
        "data": [
            "--data.data.num_profiles", "24", "--data.data.instruct_questions", "2",
            "--data.data.neutral_max_paragraphs", "30", "--data.data.utility_paragraphs", "6",
        ],
        "pretrain": [
            "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--model.vocab_size", "300",
            "--model.tiny.hidden_size", "32", "--model.tiny.num_layers", "4", "--model.tiny.num_heads", "2",
            "--model.tiny.intermediate_size", "64", "--data.background_profiles", "6",
        ],
        "inject": ["--trainer.max_steps", "-1", "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "3"],
        "instruct": ["--trainer.max_epochs", "1", "--trainer.val_check_interval", "2"],
    },
}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Generation and extraction
# ---------------------------------------------------------------------------------------------------------------


def filter_stage(
    model_dir: str,
    data_dir: str,
    out_dir: str,
    seed: int = 0,
    write_splits: bool = True,
    groups: Sequence[int] | None = None,
) -> dict:
    """Measure extraction on the non-instruction profiles and write the memorization-filtered splits.

    ``groups`` restricts the measurement to those groups' profiles (for a run injected with ``data.groups``);
    the others count as not memorized, so they join no split.
    """
    from lightning_unlearn.models import load_causal_lm, load_tokenizer

    profiles = list(load_table(data_dir, "profiles"))
    if groups is not None:
        present = sorted({int(p["group_id"]) for p in profiles})
        missing = sorted(set(groups) - set(present))
        if missing:
            raise ValueError(f"groups {missing} have no profile in {data_dir!r}; its groups are {present}.")
    targets = [p for p in profiles if not p["instruct"] and (groups is None or p["group_id"] in groups)]
    if not targets:
        raise ValueError(f"{data_dir!r} has no non-instruction profile to measure extraction on.")
    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    rates, memorized = extraction_rates(model, tokenizer, targets)
    report = {
        "model": str(model_dir),
        "groups": sorted(groups) if groups is not None else None,
        "profiles": len(targets),
        "extraction": rates,
        "memorized": {f: sorted(ids) for f, ids in memorized.items()},
    }
    splits = build_splits(profiles, memorized, seed=seed) if write_splits else {}
    if write_splits:
        report["split_sizes"] = {name: len(rows) for name, rows in splits.items()}
        empty = [name for name, n in report["split_sizes"].items() if n == 0 and name.endswith("forget")]
        if empty:
            logger.warning("[lacuna] warning: no memorized profile for %s; those splits are empty.", ", ".join(empty))
    save_splits(out_dir, splits, {"extraction.json": json.dumps(report, indent=1)})
    return report


# ---------------------------------------------------------------------------------------------------------------
# Resurfacing attack
# ---------------------------------------------------------------------------------------------------------------


def leaked_profiles(model, tokenizer, forget, k: int, temperature: float, max_new_tokens: int, seed: int) -> list[int]:
    """Profile ids of ``forget`` rows whose PII value appears in at least one of ``k`` sampled continuations of
    their prompt (:func:`~lightning_unlearn.metrics.memorization.extracted`, the filter's definition)."""
    samples = generate(model, tokenizer, list(forget["prompt"]), max_new_tokens, batch_size=8, num_samples=k,
                       temperature=temperature, seed=seed)  # fmt: skip
    leaked = set()
    for pid, answer, outs in zip(forget["profile_id"], forget["answer"], samples, strict=True):
        if any(extracted(outs, [answer] * len(outs))):
            leaked.add(int(pid))
    return sorted(leaked)


def resurface(
    model_dir: str,
    splits_dir: str,
    field: str,
    out_dir: str,
    k: int = 200,
    max_epochs: int = 10,
    lr: float = 2e-3,
    temperature: float = 1.0,
    max_new_tokens: int = 24,
    seed: int = 0,
) -> dict:
    """The resurfacing attack (Lacuna Sec. 4.3): relearn on the held-out split, count leaking forget profiles.

    Relearning is the instruction tuning procedure (``InstructionModule``: LoRA on the last two blocks, lr
    ``lr``) on every row of ``<splits_dir>/relearn`` for ``max_epochs`` epochs. A forget profile leaks when its
    ``field`` value appears in at least one of ``k`` sampled generations for its forget prompt (Lacuna: K = 200);
    the same count on the model before relearning is reported beside it (``leaked_profiles_unlearned``). Seeded:
    the same arguments give the same report.
    """
    from datasets import load_from_disk
    from lightning.pytorch import Trainer, seed_everything

    from lightning_unlearn.data.instruction_datamodule import InstructionDataModule
    from lightning_unlearn.models import load_causal_lm, load_tokenizer
    from lightning_unlearn.objectives.instruction import InstructionModule

    forget_path = Path(splits_dir) / field / "forget"
    relearn_path = Path(splits_dir) / "relearn"
    for p in (forget_path, relearn_path):
        if not p.exists():
            raise FileNotFoundError(f"split {str(p)!r} does not exist; run `lightning-unlearn lacuna filter` first.")
    forget = load_from_disk(str(forget_path))
    if len(forget) == 0:
        raise ValueError(f"forget split {str(forget_path)!r} is empty: nothing can leak.")
    if len(load_from_disk(str(relearn_path))) == 0:
        raise ValueError(f"relearning split {str(relearn_path)!r} is empty: the testbed memorized no relearn profile.")
    sampling = dict(k=k, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    before = leaked_profiles(model, tokenizer, forget, **sampling)
    del model
    seed_everything(seed, verbose=False)
    relearned = Path(out_dir) / "relearned"
    shutil.rmtree(relearned, ignore_errors=True)
    module = InstructionModule(model_path=model_dir, optim=OptimizerConfig(lr=lr))
    data = InstructionDataModule(source=str(relearn_path), val_fraction=0.0, seed=seed)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=max_epochs,
        default_root_dir=str(relearned),
        enable_checkpointing=False,
        enable_progress_bar=False,
        logger=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, data)
    model_path = relearned / "export" / "model"
    model, tokenizer = load_causal_lm(model_path), load_tokenizer(model_path)
    leaked = leaked_profiles(model, tokenizer, forget, **sampling)
    shutil.rmtree(relearned / "export", ignore_errors=True)  # a full model per attack; the counts are the result
    n = len(forget)
    report = {
        "model": str(model_dir),
        "field": field,
        "k": k,
        "relearn_epochs": max_epochs,
        "seed": seed,
        "forget_profiles": n,
        "leaked_profiles_unlearned": len(before),
        "leak_rate_unlearned": len(before) / n,
        "leaked_profiles": len(leaked),
        "leak_rate": len(leaked) / n,
        "leaked_profile_ids_unlearned": before,
        "leaked_profile_ids": leaked,
    }
    write_text_atomically(Path(out_dir, "resurfacing.json"), json.dumps(report, indent=1))
    return report


# ---------------------------------------------------------------------------------------------------------------
# Locality check
# ---------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------
# The stage chain
# ---------------------------------------------------------------------------------------------------------------


def _fit_cmd(config: str, root: Path, overrides: list[str], overlays: Sequence[Path] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "lightning_unlearn.cli", "fit", "-c", str(CONFIG_DIR / config)]
    for overlay in overlays:
        cmd += ["-c", str(overlay)]
    cmd += overrides
    cmd += ["--trainer.default_root_dir", str(root)]
    last = latest_checkpoint(root)
    if last is not None:
        cmd += ["--ckpt_path", str(last)]
    return cmd


def _data_config(preset_args: Sequence[str]) -> LacunaDataConfig:
    """The :class:`LacunaDataConfig` that a preset's ``--data.data.<field> <value>`` overrides describe."""
    import yaml

    kwargs = {}
    for key, value in zip(preset_args[::2], preset_args[1::2], strict=True):
        if key.startswith("--data.data."):
            kwargs[key.removeprefix("--data.data.")] = yaml.safe_load(value)
    return LacunaDataConfig(**kwargs)


def _check_recipe(stage: str, root: Path, recipe: dict, finished: bool, log) -> None:
    """Refuse a stage directory built (or started) from other configs or overrides; record the recipe otherwise."""
    path = root / "recipe.json"
    fix = f"Delete {str(root)!r} (and the stages after it) to rebuild it, or choose another --workdir."
    found = recipes.check_recipe(path, recipe, f"stage {stage} in {str(root)!r}", "this run's", fix)
    if found is None and finished:
        log(f"[lacuna] {stage}: built before stage recipes were recorded; its configs are not checked")
    elif found is None:
        recipes.record_recipe(path, recipe)
    elif found.get("code") not in (None, recipe["code"]):  # recipes from before the digest was recorded have none
        # Code defaults (not in the configs) may have changed; the user decides whether that matters.
        log(
            f"[lacuna] {stage}: built by other lightning_unlearn code than this checkout's (source digest "
            f"{found['code']} vs {recipe['code']}); reusing it. Delete {str(root)!r} to rebuild it with this code."
        )


def _check_provenance(w: Path, record: dict) -> None:
    """Refuse a work directory whose finished stages came from another starting model or overlay."""
    path = w / "chain.json"
    if path.exists():
        # Work directories from before --instruct_config existed were built without instruction overlays.
        found = {"instruct_configs": [], **json.loads(path.read_text())}
        found = {k: v for k, v in found.items() if k not in VERDICT_KEYS}
        if found != record:
            raise ValueError(
                f"work directory {str(w)!r} was built with {found}, not {record}; its finished stages would be reused "
                "for the wrong model. Choose another --workdir or delete this one."
            )
        return
    write_text_atomically(path, json.dumps(record, indent=1, sort_keys=True))


VERDICT_KEYS = ("verdicts", "separable")  # chain.json keys that record results, not how the stages were built


def _record_verdicts(w: Path, verdicts: dict[str, str], separable: bool) -> None:
    """Add the verdict lines (and whether the testbed is separable) to ``chain.json``."""
    path = w / "chain.json"
    record = {**json.loads(path.read_text()), "verdicts": verdicts, "separable": separable}
    write_text_atomically(path, json.dumps(record, indent=1, sort_keys=True))


def testbed_separable(workdir: str | os.PathLike) -> bool | None:
    """Whether ``lacuna run`` found the testbed in ``workdir`` separable (``None``: not measured)."""
    path = Path(workdir) / "chain.json"
    return json.loads(path.read_text()).get("separable") if path.exists() else None


def run_chain(
    workdir: str,
    size: str = "default",
    parallel: bool | None = None,
    log: Callable[[str], None] = logger.info,
    model_path: str | None = None,
    inject_configs: Sequence[str] = (),
    instruct_configs: Sequence[str] = (),
    control: bool = CONTROL_BY_DEFAULT,
    instruct: bool = False,
) -> dict:
    """Run (or reuse) every stage of the chain in ``workdir``; returns the filter reports.

    The reports are ``masked`` (θ_inj, or with ``instruct`` the instruction-tuned model; it also wrote the splits),
    with ``instruct`` ``masked_inj`` (θ_inj, measured before instruction tuning, no splits); with the control,
    ``unmasked`` (and ``unmasked_inj``) too; and
    ``separability`` (:mod:`~lightning_unlearn.workflows.lacuna.separability`, also in ``separability.json``), whose
    verdict joins the memorization and split verdicts in the log and in ``chain.json``.

    Args:
        workdir: where every stage writes (data, stage roots, splits).
        size: a :data:`SIZES` preset.
        parallel: run independent stages side by side (default: with ≥ 2 cores).
        log: where progress lines go.
        model_path: start both injections from this local HF model (or ``"smollm2"``) and skip pretraining;
            ``None`` uses the built-in θ_pre (the size preset's pretraining config).
        inject_configs: YAML overlays added after ``inject.yaml``/``inject_unmasked.yaml``.
        instruct_configs: YAML overlays added after ``instruct.yaml`` (both instruction tunings).
        control: also build the UnMask control (``inject_unmasked.yaml``, then its instruction tuning and filters),
            side by side with the masked stages. A work directory built without it can add it later.
        instruct: run the instruction stage (``instruct.yaml``) and build the splits from its model; the default
            chain has none (:data:`NO_INSTRUCT_REASON`).
    """
    if size not in SIZES:
        raise ValueError(f"size {size!r} is not one of {sorted(SIZES)}.")
    overlays = _overlays(inject_configs, "--inject_config")
    instruct_overlays = _overlays(instruct_configs, "--instruct_config")
    w = Path(workdir).resolve()
    preset = SIZES[size]
    pretrain_config = preset.get("pretrain_config", ["pretrain.yaml"])[0]
    data_dir = ["--data.data_dir", str(w / "data")]
    data_args = [*data_dir, *preset.get("data", [])]
    base = resolve_model_dir(model_path, "--model_path") if model_path is not None else None
    _check_provenance(
        w,
        {
            "size": size,
            "model": str(base) if base else f"built-in ({pretrain_config})",
            "inject_configs": [str(o) for o in overlays],
            "instruct_configs": [str(o) for o in instruct_overlays],
            **({"instruct": False} if not instruct else {}),
        },
    )
    started = time.time()
    cores = os.cpu_count() or 1
    parallel = cores >= 2 if parallel is None else parallel

    def done(path: Path, stage: str, cmd: list[str] | None = None, inputs: Sequence[Path] = ()) -> bool:
        # A training stage (cmd given) must match the recipe it was built with, and any stage must be newer than
        # the outputs it was made from (else one of them was rebuilt after it). A stale training stage is an
        # error (rebuilding it is the user's call); a stale filter, seconds of work, is measured again.
        if cmd is not None:
            _check_recipe(stage, Path(cmd[cmd.index("--trainer.default_root_dir") + 1]), recipes.command_recipe(cmd, w),
                          path.exists(), log)  # fmt: skip
        if not path.exists():
            return False
        newer = [i for i in inputs if i.exists() and i.stat().st_mtime_ns > path.stat().st_mtime_ns]
        if newer and cmd is not None:
            raise ValueError(
                f"stage {stage}: {str(path)!r} is older than its input {str(newer[0])!r}, which was rebuilt after it. "
                f"Delete {str(path)!r} to rebuild it from the new input, or choose another --workdir."
            )
        if newer:
            log(f"[lacuna] {stage}: {path} is older than {newer[0]}; measuring again")
            return False
        log(f"[lacuna] {stage}: finished before, reusing {path}")
        return True

    def run(stages: list[tuple[str, list[str], Path]]) -> None:
        # Stages given together are independent; on ≥ 2 cores they run side by side, sharing the cores. The first
        # shows its progress bar here, the others write theirs to <root>/stage.log.
        procs = []
        begun = time.time()
        threads = max(1, cores // max(1, len(stages))) if parallel else cores
        for i, (name, cmd, root) in enumerate(stages):
            root.mkdir(parents=True, exist_ok=True)
            log(f"[lacuna] {name}: {' '.join(cmd[2:])}")
            if parallel and i > 0:
                log(f"[lacuna] {name}: running alongside; progress in {root / 'stage.log'}")
                procs.append((name, processes.spawn_stage(cmd, threads, root / "stage.log"), root))
            else:
                procs.append((name, processes.spawn_stage(cmd, threads), root))
            if not parallel:
                procs[-1][1].wait()
                log(f"[lacuna] {name}: finished in {time.time() - begun:.0f} s")
        for name, proc, root in procs:
            if proc.wait() != 0:
                hint = f" (see {root / 'stage.log'})" if (root / "stage.log").exists() else ""
                raise RuntimeError(f"stage {name} failed with exit code {proc.returncode}{hint}.")
            if parallel:
                together = " (side by side)" if len(stages) > 1 else ""
                log(f"[lacuna] {name}: finished after {time.time() - begun:.0f} s{together}")

    if base is not None:
        pre_model = base
        log(f"[lacuna] pretrain: skipped; both injections start from {base}")
        # The two injections run side by side; build the data first so they do not both write it.
        build_testbed_data(w / "data", _data_config(preset.get("data", [])), log=lambda m: log(f"[lacuna] {m}"))
    else:
        pre_model = w / "pretrain" / "export" / "model"
        # where the stage keeps what it builds before training: the tiny θ_pre's tokenizer, the derived model
        keep = ["--model.tokenizer_path", str(w / "tokenizer")] if preset.get("pretrain_config") else [
            "--model.derive.path", str(w / "base")]  # fmt: skip
        overrides = [*data_args, *keep, *preset["pretrain"]]
        cmd = _fit_cmd(pretrain_config, w / "pretrain", overrides)
        if not done(pre_model, "pretrain", cmd):
            run([("pretrain", cmd, w / "pretrain")])
    todo = []
    injections = (("inject", "inject.yaml"), ("inject_unmasked", "inject_unmasked.yaml"))[: 2 if control else 1]
    for name, config in injections:
        overrides = [*data_args, "--model.model_path", str(pre_model), *preset["inject"]]
        cmd = _fit_cmd(config, w / name, overrides, overlays)
        if not done(w / name / "export" / "inj", name, cmd, [pre_model]):
            todo.append((name, cmd, w / name))
    run(todo)
    reports = {}
    if instruct:
        todo = []
        tunings = (("instruct", "inject"), ("instruct_unmasked", "inject_unmasked"))[: 2 if control else 1]
        for name, source in tunings:
            source_model = w / source / "export" / "inj"
            overrides = [*data_dir, "--model.model_path", str(source_model), *preset["instruct"]]
            cmd = _fit_cmd("instruct.yaml", w / name, overrides, instruct_overlays)
            if not done(w / name / "export" / "model", name, cmd, [source_model]):
                todo.append((name, cmd, w / name))
        run(todo)
        filters = [
            ("masked", w / "instruct" / "export" / "model", w / "splits", True),
            ("masked_inj", w / "inject" / "export" / "inj", w / "filter_inj", False),
        ]
        if control:
            filters += [
                ("unmasked", w / "instruct_unmasked" / "export" / "model", w / "filter_unmasked", False),
                ("unmasked_inj", w / "inject_unmasked" / "export" / "inj", w / "filter_inj_unmasked", False),
            ]
    else:
        log(f"[lacuna] instruct: skipped. {NO_INSTRUCT_REASON}")
        filters = [("masked", w / "inject" / "export" / "inj", w / "splits", True)]
        if control:
            filters.append(("unmasked", w / "inject_unmasked" / "export" / "inj", w / "filter_unmasked", False))
    for name, model, out, write in filters:
        if done(out / "extraction.json", f"filter ({name})", inputs=[model]):
            reports[name] = json.loads((out / "extraction.json").read_text())
        else:
            log(f"[lacuna] filter ({name}): measuring extraction with {model}")
            begun = time.time()
            reports[name] = filter_stage(str(model), str(w / "data"), str(out), write_splits=write)
            log(f"[lacuna] filter ({name}): finished in {time.time() - begun:.0f} s")
    log(
        format_table(reports["masked"], reports.get("unmasked"), reports.get("masked_inj"), reports.get("unmasked_inj"))
    )
    log(format_split_sizes(reports["masked"]["split_sizes"]))
    export = w / "inject" / "export"
    if done(w / "separability.json", "separability", inputs=[export / "inj"]):
        reports["separability"] = json.loads((w / "separability.json").read_text())
    else:
        log(f"[lacuna] separability: resetting each group's mask elements of {export / 'inj'} to θ_pre")
        begun = time.time()
        reports["separability"] = separability_report(export, w / "data", log=log)
        write_report(reports["separability"], w / "separability.json")
        log(f"[lacuna] separability: finished in {time.time() - begun:.0f} s")
    log(format_separability(reports["separability"]))
    verdicts = {
        "memorization": target_verdict(reports["masked"]),
        "splits": split_verdict(reports["masked"]["split_sizes"]),
        "separability": separability_verdict(reports["separability"]),
    }
    for line in verdicts.values():
        log(line)
    _record_verdicts(w, verdicts, reports["separability"]["met"])
    log(f"[lacuna] done in {time.time() - started:.0f} s; splits in {w / 'splits'}")
    return reports


def target_verdict(masked: dict, rate: float = 0.5, fields: int = 2) -> str:
    """Whether the masked model meets Lacuna's memorization target: ≥ ``rate`` extraction on ≥ ``fields`` fields."""
    met = [f for f in TARGET_FIELDS if masked["extraction"][f] >= rate]
    verdict = "met" if len(met) >= fields else "NOT met"
    detail = ", ".join(met) if met else "none"
    line = f"[lacuna] target (masked, ≥ {rate:.0%} on ≥ {fields} fields): {verdict}; fields at or above: {detail}"
    if len(met) < fields:
        line += " (docs/lacuna_memorization.md: what was measured, and the real-model path)"
    return line


def _overlays(configs: Sequence[str], flag: str) -> list[Path]:
    # a local file, else a shipped config by name (lacuna/inject_smollm2.yaml)
    overlays = [Path(resolve_config(c)).expanduser().resolve() for c in configs]
    for given, overlay in zip(configs, overlays, strict=True):
        if not overlay.is_file():
            raise FileNotFoundError(f"{flag} {given!r} does not exist; pass a YAML file or a shipped config name.")
    return overlays


def format_table(
    masked: dict, unmasked: dict | None = None, masked_inj: dict | None = None, unmasked_inj: dict | None = None
) -> str:
    """Extraction rate per field as a text table: the masked model after instruction tuning, and (when given) on
    θ_inj before it, each beside the UnMask control's when that was built."""
    after = [c for c in (masked, unmasked) if c is not None]
    before = [c for c in (masked_inj, unmasked_inj) if c is not None] if masked_inj is not None else []
    names = ["masked", "unmasked"][: len(after)]
    lines = [f"Extraction rate per field ({masked['profiles']} profiles; greedy answer contains the PII value)"]
    if before:
        width = 12 * len(after)
        lines.append(f"{'':<18}{'after instruction tuning':>{width}}{'θ_inj, before it':>{width}}")
    lines.append(f"{'field':<18}" + "".join(f"{n:>12}" for n in names) * (1 + bool(before)))
    for f in TARGET_FIELDS:
        lines.append(f"{f:<18}" + "".join(f"{c['extraction'][f]:>12.2%}" for c in after + before))
    return "\n".join(lines)


def format_split_sizes(sizes: dict[str, int]) -> str:
    """Rows of every memorization-filtered split, one line per field, as a text table."""
    columns = ("forget", "retain", "forget_paraphrase", "retain_paraphrase", "tune_forget", "tune_retain")
    lines = ["Memorization-filtered splits (rows; forget: groups 0-2, retain: groups 3-5, cross-field)",
             f"{'field':<18}" + "".join(f"{c:>19}" for c in columns)]  # fmt: skip
    for f in TARGET_FIELDS:
        lines.append(f"{f:<18}" + "".join(f"{sizes[f'{f}/{c}']:>19}" for c in columns))
    lines.append(f"relearn: {sizes['relearn']} rows (held-out profiles, for the resurfacing attack)")
    return "\n".join(lines)


def split_verdict(sizes: dict[str, int], minimum: int = 8) -> str:
    """Whether every field's forget and retain splits hold at least ``minimum`` pairs."""
    short = [f"{f} {s} {sizes[f'{f}/{s}']}" for f in TARGET_FIELDS for s in ("forget", "retain")
             if sizes[f"{f}/{s}"] < minimum]  # fmt: skip
    verdict = "met" if not short else "NOT met (" + ", ".join(short) + ")"
    return f"[lacuna] splits (≥ {minimum} forget and ≥ {minimum} retain pairs for every field): {verdict}"


# ---------------------------------------------------------------------------------------------------------------
# Commands (``lightning-unlearn lacuna <name>``)
# ---------------------------------------------------------------------------------------------------------------


Size = Literal[tuple(SIZES)]
Field = Literal[TARGET_FIELDS]


def run_command(
    *,
    workdir: str = "runs/lacuna",
    size: Size = "default",
    sequential: bool = False,
    model_path: str | None = None,
    inject_config: list[str] | None = None,
    instruct_config: list[str] | None = None,
    control: bool = CONTROL_BY_DEFAULT,
    instruct: bool = False,
) -> dict:
    """Run (or reuse) the whole Lacuna chain: pretrain, inject (and the control), filter, separability.

    Progress and the extraction table (after instruction tuning, and on θ_inj before it) go to the log; the result
    is the extraction rate per field of each measured model, as JSON.

    Args:
        workdir: work directory of every stage (data, stage roots, splits).
        size: size preset (``tiny``: seconds, for tests).
        sequential: never run two stages side by side (default: side by side on two or more cores).
        model_path: start both injections from this local HF model directory (or ``smollm2``) and skip pretraining.
        inject_config: YAML overlays for both injections, e.g. ``lacuna/inject_smollm2.yaml``.
        instruct_config: YAML overlays for both instruction tunings, e.g. one that sets ``model.init_args.optim.lr``.
        control: also build the UnMask control (unmasked injection, its instruction tuning and filters), which the
            localization report's contrast families need; it runs side by side with the masked stages.
        instruct: add the instruction stage (LoRA on the last two blocks) and build the splits from its model. The
            default has none: the injected QA use the probe's wording, and no adapter beat θ_inj on held-out profiles.
    """
    with processes.terminate_children_on_exit():  # SIGTERM / SIGHUP end every stage too
        reports = run_chain(
            workdir,
            size,
            parallel=False if sequential else None,
            model_path=model_path,
            inject_configs=inject_config or (),
            instruct_configs=instruct_config or (),
            control=control,
            instruct=instruct,
        )
    result = {name: report["extraction"] for name, report in reports.items() if name != "separability"}
    sep = reports["separability"]
    result["separability"] = {"met": sep["met"], "utility": sep["utility"],
                              **{name: r["met"] for name, r in sep["resets"].items()}}  # fmt: skip
    return result


def data_command(*, out: str = "runs/lacuna/data", data: LacunaDataConfig | None = None) -> str:
    """Build the Lacuna testbed data directory; the result is its path.

    Args:
        out: the data directory.
        data: what the data is made of (default: :class:`LacunaDataConfig`'s defaults), e.g.
            ``--data.num_profiles 18``.
    """
    return str(build_testbed_data(out, data or LacunaDataConfig(), log=logger.info))


def filter_command(
    *,
    model: str = "runs/lacuna/inject/export/inj",
    data: str = "runs/lacuna/data",
    out: str = "runs/lacuna/splits",
    seed: int = 0,
    groups: list[int] | None = None,
) -> dict:
    """Measure extraction per field and write the memorization-filtered splits.

    Greedy answers on the non-instruction profiles; the splits are ``datasets`` directories next to
    ``extraction.json``; the result is the profile count, the rates and the split sizes.

    Args:
        model: the model to measure.
        data: the testbed data directory.
        out: where the splits and ``extraction.json`` go.
        seed: seed of the split assignment.
        groups: measure only these groups' profiles (a run injected with ``data.groups``).
    """
    report = filter_stage(model, data, out, seed, groups=groups)
    return {k: report[k] for k in ("profiles", "extraction", "split_sizes")}


def resurface_command(
    *,
    model: str,
    out: str,
    splits: str = "runs/lacuna/splits",
    field: Field = "email",
    k: int = 200,
    epochs: int = 10,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict:
    """Resurfacing attack: relearn on held-out PII, then count the forget profiles that leak.

    A forget profile leaks when its ``field`` value appears in at least one of ``k`` sampled generations; the
    count before relearning is reported beside it.

    Args:
        model: the (unlearned) model directory to attack.
        out: where the relearned model and ``resurfacing.json`` go.
        splits: the memorization-filtered splits (``lacuna filter``).
        field: the PII field attacked.
        k: sampled generations per forget prompt (Lacuna: 200).
        epochs: relearning epochs.
        temperature: sampling temperature.
        seed: seed of the relearning and of the sampling.
    """
    report = resurface(model, splits, field, out, k, epochs, temperature=temperature, seed=seed)
    return {key: value for key, value in report.items() if not key.startswith("leaked_profile_ids")}


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


def main(argv: list[str] | None = None) -> None:
    """``lightning-unlearn lacuna {run,data,filter,resurface,locality,localization}``."""
    from lightning_unlearn.workflows.command import dispatch
    from lightning_unlearn.workflows.lacuna.localization import localization_command

    commands = {
        "run": run_command,
        "data": data_command,
        "filter": filter_command,
        "resurface": resurface_command,
        "locality": locality_command,
        "localization": localization_command,
    }
    description = "The Lacuna testbed: the chain, each of its steps, and the localization precision run."
    dispatch(commands, argv, "lightning-unlearn lacuna", description)


__all__ = [
    "extraction_rates",
    "filter_stage",
    "format_table",
    "generate",
    "locality_report",
    "resurface",
    "run_chain",
    "target_verdict",
    "write_directory_atomically",
]
