"""Lacuna's findings on a built testbed (Lacuna Sec. 4.3, App. E–F): ``lightning-unlearn lacuna localization``.

For every PII field and every method — by default Lacuna's: OracleGrad (gradient difference restricted to m^F),
GA, SimNPO, MemFlex and AlphaEdit; on request the field's others: RMU, IdkDPO, UNDIAL, IdkNLL, WGA and SatImp — each
with its shipped ``lacuna/<method>.yaml`` (Lacuna Table 5, epochs scaled by ``epoch_scale``) on the
memorization-filtered splits of a testbed work directory written by ``lightning-unlearn lacuna run``:

1. **Unlearn**: ``lightning-unlearn fit`` from the instruction-tuned model, one checkpoint after the last epoch, with
   the library's evaluation callbacks on that checkpoint: ``MemorizationEvaluation`` (EM / ES / Prob and the
   extraction rate on forget, retain and both paraphrase splits) and ``RetainDriftEvaluation`` on held-out neutral
   text (utility: CE / PPL and ΔCE against the model before unlearning); with the testbed's retain reference
   (``lacuna reference``: the start model with m^F reset to θ_pre, exported on the same separability terms as this
   report) also ``TOFUEvaluation`` (forget quality, model utility) and ``MIAEvaluation`` (the forget people vs the
   held-out people: AUC and PrivLeak). A ``validate`` of the starting model gives the same rows before unlearning.
2. **The UnMask control**: every method but OracleGrad (whose control is undefined, App. E) is run again from the
   unmasked-injection model, for the contrast families.
3. **Localization**: ``mask-auc`` on the weight change, every family against m^F and against m^F ∨ m^R.
4. **Resurfacing** (Sec. 4.3): relearn the unlearned model on the held-out relearning split with the instruction
   tuning procedure (validated on the split's own held-out profiles, best validation checkpoint kept), sample K
   (200) continuations per forget prompt, and count the forget profiles whose PII appears in at least one; the same
   count on the unlearned model before relearning sits beside it, and the starting model's under ``before``. Every
   rate has its Wilson 95 % interval. The sanity line: relearning must not lower the starting model's leak (an
   attack that does damages recall instead of restoring it). Seeded: a re-run gives the same numbers.

Writes ``<out>/summary.json``, ``<out>/report.md`` (one table per field) and ``<out>/report.png`` (AUC and resurfacing
per method and field). A finished run (its export exists, made from the same arguments) is reused, so an interrupted
report resumes where it stopped; so are scores and attacks. Fits, scores and attacks run as one-thread subprocesses,
``parallel`` at a time. When the memorization filter kept no forget or no retain pair for a field (tiny testbeds
memorize little), that field's splits are rebuilt from all non-instruction profiles (``splits_unfiltered/``) and the
summary says so.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lightning_unlearn.atomic import write_directory_atomically, write_text_atomically
from lightning_unlearn.data.templates import TARGET_FIELDS
from lightning_unlearn.data.testbed_data import data_forget_retain_groups
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.workflows import processes, recipes
from lightning_unlearn.workflows.fit_command import FitCommand
from lightning_unlearn.workflows.lacuna.chain import CONFIG_DIR, require_separable
from lightning_unlearn.workflows.lacuna.resurface import K, format_sanity, resurfacing_sanity
from lightning_unlearn.workflows.lacuna.testbed_layout import exported_model, testbed_paths

logger = logging.getLogger("lightning_unlearn")

# method -> (shipped config lacuna/<name>.yaml, restricted to m^F, has an UnMask control run)
METHODS: dict[str, tuple[str, bool, bool]] = {
    "oracle_grad": ("oracle_grad.yaml", True, False),
    "ga": ("ga.yaml", False, True),
    "simnpo": ("simnpo.yaml", False, True),
    "memflex": ("memflex.yaml", False, True),
    "alphaedit": ("alphaedit.yaml", False, True),
    # the field's other methods (Lacuna evaluates none of them): the Lacuna protocol with OpenUnlearning's constants
    "rmu": ("rmu.yaml", False, True),
    "idk_dpo": ("idk_dpo.yaml", False, True),
    "undial": ("undial.yaml", False, True),
    "idk_nll": ("idk_nll.yaml", False, True),
    "wga": ("wga.yaml", False, True),
    "satimp": ("satimp.yaml", False, True),
}
LABELS = {"oracle_grad": "OracleGrad", "ga": "GA", "simnpo": "SimNPO", "memflex": "MemFlex", "alphaedit": "AlphaEdit",
          "rmu": "RMU", "idk_dpo": "IdkDPO", "undial": "UNDIAL", "idk_nll": "IdkNLL", "wga": "WGA",
          "satimp": "SatImp"}  # fmt: skip
# The report's default methods: Lacuna's own five (the others are asked for by name, `--methods '[rmu, ...]'`).
LACUNA_METHODS = ("oracle_grad", "ga", "simnpo", "memflex", "alphaedit")
# Methods the testbed cannot run, and why: named in the refusal.
REFUSED = {
    "dpo": "DPO prefers the forget set's `preferred` answers, which the testbed's splits do not have; use idk_dpo "
    "(DPO toward an 'I don't know' answer, built per row from the shipped list)",
}
Method = Literal[(*METHODS, *REFUSED)]  # a refused method reaches the check that says why
Field = Literal[TARGET_FIELDS]
FAMILIES = ("raw", "qtile", "layernorm", "signrev", "reversal", "dirreversal", "contrast", "contrastnorm", "compnorm",
            "composite")  # fmt: skip
EVAL_SPLITS = ("forget", "forget_paraphrase", "retain", "retain_paraphrase")
UTILITY_RECORDS = 48  # neutral windows scored for utility


def ensure_splits(workdir: str | os.PathLike, field: str, seed: int = 0) -> tuple[Path, bool]:
    """``(splits dir, filtered)``: the memorization-filtered splits when ``field``'s forget and retain are non-empty,
    else splits built from all non-instruction profiles in ``<workdir>/splits_unfiltered``."""
    from datasets import load_from_disk

    from lightning_unlearn.data.splits import build_splits, save_splits
    from lightning_unlearn.data.testbed_data import load_holdout_profiles, load_table

    if field not in TARGET_FIELDS:
        raise ConfigError(f"field {field!r} is not one of {TARGET_FIELDS}.")
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
        holdout = load_holdout_profiles(str(w / "data"))
        save_splits(
            unfiltered, build_splits(profiles, {f: everyone for f in TARGET_FIELDS}, seed=seed, holdout=holdout)
        )
    if not usable(unfiltered):
        raise ConfigError(f"the testbed in {str(w)!r} has no forget or no retain profile for {field!r}.")
    return unfiltered, False


def split_sizes(splits: Path, field: str) -> dict[str, int]:
    """Rows of each evaluation split of ``field`` and of the relearning split."""
    from datasets import load_from_disk

    sizes = {s: len(load_from_disk(str(splits / field / s))) for s in EVAL_SPLITS}
    sizes["relearn"] = len(load_from_disk(str(splits / "relearn"))) if (splits / "relearn").exists() else 0
    return sizes


def utility_records(data_dir: Path, out: Path, n: int = UTILITY_RECORDS) -> Path:
    """Held-out general text for utility: ``n`` paragraphs of the testbed's ``utility`` table (held out of every
    training stage), each cut into a 12-word prompt and a continuation of up to 48 words, as ``{prompt, answer}``
    JSONL (written once)."""
    from lightning_unlearn.data.testbed_data import load_table

    if out.exists():
        return out
    texts = [t for t in load_table(str(data_dir), "utility")["text"] if len(t.split()) >= 20][-n:]
    if not texts:
        raise ConfigError(f"the testbed data {str(data_dir)!r} has no utility paragraph of ≥ 20 words.")
    rows = []
    for text in texts:
        words = text.split()
        rows.append({"prompt": " ".join(words[:12]), "answer": " " + " ".join(words[12:60])})
    write_text_atomically(out, "".join(json.dumps(r) + "\n" for r in rows))
    return out


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


def method_epochs(method: str, epoch_scale: float, epochs: Mapping[str, int] | None = None) -> int:
    """The method's epochs: ``epochs[method]`` when given, else its Table 5 epochs (its config's
    ``trainer.max_epochs``) times ``epoch_scale``, at least 1."""
    import yaml

    if epochs and method in epochs:
        return int(epochs[method])
    config = yaml.safe_load((CONFIG_DIR / METHODS[method][0]).read_text())
    return max(1, round(int(config["trainer"]["max_epochs"]) * epoch_scale))


def evaluators(
    splits: Path, field: str, utility: Path, out: Path, before: bool = False, reference: Path | None = None
) -> list[dict]:
    """The evaluation callbacks of every run of ``field``: output-level memorization and utility, into ``out``
    (``before``: for the ``validate`` of the starting model, which is its own utility base); with the testbed's
    ``reference`` (``lacuna reference``), TOFU's forget quality and model utility on the field's forget and retain
    splits, and membership inference with PrivLeak on ``mia/members`` vs ``mia/nonmembers`` (each where the splits
    have what it reads: splits written before the truth-ratio columns and the held-out people have neither)."""
    memorization = {
        "class_path": "lightning_unlearn.callbacks.MemorizationEvaluation",
        "init_args": {"splits": {s: str(splits / field / s) for s in EVAL_SPLITS}, "max_new_tokens": 24,
                      "max_length": 128, "batch_size": 16, "output_dir": str(out)},
    }  # fmt: skip
    drift = {
        "class_path": "lightning_unlearn.callbacks.RetainDriftEvaluation",
        "init_args": {"records": str(utility), "name": "utility", "max_length": 96, "batch_size": 16,
                      "output_dir": str(out), "current_is_base": before},
    }  # fmt: skip
    field_metrics = []
    if reference is not None and _has_truth_ratio_columns(splits / field / "forget"):
        field_metrics.append({
            "class_path": "lightning_unlearn.callbacks.TOFUEvaluation",
            "init_args": {"splits": {s: str(splits / field / s) for s in ("forget", "retain")},
                          "reference_model": str(reference), "rouge": False, "max_length": 128, "batch_size": 16,
                          "output_dir": str(out)},
        })  # fmt: skip
    if reference is not None and (splits / "mia" / "nonmembers").exists():
        field_metrics.append({
            "class_path": "lightning_unlearn.callbacks.MIAEvaluation",
            "init_args": {"members": str(splits / "mia" / "members"), "nonmembers": str(splits / "mia" / "nonmembers"),
                          "reference_model": str(reference), "max_length": 128, "batch_size": 16,
                          "output_dir": str(out)},
        })  # fmt: skip
    return [memorization, drift, *field_metrics]


def _has_truth_ratio_columns(split: Path) -> bool:
    from datasets import load_from_disk

    from lightning_unlearn.data.records import TRUTH_RATIO_COLUMNS

    return split.exists() and set(TRUTH_RATIO_COLUMNS) <= set(load_from_disk(str(split)).column_names)


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
    callbacks: Sequence[dict] = (),
    stage: str = "fit",
    forget_groups: Sequence[int] | None = None,
    model_args: Mapping[str, object] | None = None,
) -> FitCommand:
    """The ``lightning-unlearn fit`` (or ``validate``) of one run; its overrides file is written to ``out``.

    One checkpoint, after the last epoch, and ``callbacks`` beside it; no logger or progress bar. A method restricted
    to m^F gets ``forget_groups`` (the testbed's; ``None``: its config's). ``model_args`` set the method's own
    arguments (``{"gamma": 1.0}`` → ``--model.init_args.gamma 1.0``) over its config's.
    """
    config, restricted, _ = METHODS[method]
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(out / "checkpoints"), "filename": "final", "every_n_epochs": epochs,
                      "every_n_train_steps": 0, "save_top_k": 1},
    }  # fmt: skip
    overrides = {
        "trainer": {
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": False,
            "callbacks": [checkpoint, *callbacks],
        }
    }
    write_text_atomically(out / "overrides.yaml", json.dumps(overrides, indent=1))
    args = [
        "--model.init_args.model_path", str(start_model),
        "--data.init_args.tokenizer_path", str(start_model),
        "--data.init_args.forget_path", str(splits / field),
        "--trainer.max_epochs", str(epochs),
    ]  # fmt: skip
    if restricted:
        args += ["--model.init_args.masks_path", str(masks)]
        if forget_groups is not None:
            args += ["--model.init_args.forget_groups", json.dumps(list(forget_groups))]
    if lr is not None:
        args += ["--model.init_args.optim.lr", str(lr)]
    if batch_size is not None:
        args += ["--data.init_args.batch_size", str(batch_size)]
    for name, value in (model_args or {}).items():
        args += [f"--model.init_args.{name}", json.dumps(value)]
    return FitCommand([CONFIG_DIR / config, out / "overrides.yaml"], out, args, subcommand=stage)


class _Jobs:
    """Runs ``lightning-unlearn`` commands ``parallel`` at a time, each a subprocess with ``threads`` threads and
    its output in a log file, or one after the other in this process (``in_process``, for tests)."""

    def __init__(self, parallel: int, in_process: bool, log: Callable[[str], None]) -> None:
        self.parallel = max(1, parallel)
        self.threads = max(1, processes.thread_budget() // self.parallel)
        self.in_process = in_process
        self.log = log

    def run(self, jobs: Sequence[tuple[FitCommand | list[str], Path]], optional: Sequence[Path] = ()) -> list[Path]:
        """``jobs``: ``(a fit, or cli arguments, log file)``; raises naming the first that failed, after the others
        end, unless its log file is in ``optional``: those failures are returned (their log files)."""
        jobs = [(job.args() if isinstance(job, FitCommand) else list(job), log_file) for job, log_file in jobs]
        if self.in_process:
            from lightning_unlearn.cli import main as cli_main

            for args, _ in jobs:
                self.log(f"[localization] lightning-unlearn {' '.join(args)}")
                cli_main(list(args))
            return []
        pending, running, failed = list(jobs), [], []
        while pending or running:
            while pending and len(running) < self.parallel:
                args, log_file = pending.pop(0)
                self.log(f"[localization] lightning-unlearn {' '.join(args)}")
                cmd = [sys.executable, "-m", "lightning_unlearn.cli", *args]
                running.append((processes.spawn_stage(cmd, self.threads, log_file), log_file))
            time.sleep(0.2)
            for job in [j for j in running if j[0].poll() is not None]:
                running.remove(job)
                if job[0].returncode != 0:
                    failed.append(job)
        required = [j for j in failed if j[1] not in set(optional)]
        if required:
            proc, log_file = required[0]
            raise RuntimeError(f"{len(required)} run(s) failed; see {log_file} (exit code {proc.returncode}).")
        return [j[1] for j in failed]


def _recipe_matches(out: Path, recipe: dict, fitted: bool = False) -> bool:
    """Whether ``out`` holds a finished run of ``recipe`` (the same recorded arguments and its export, or with
    ``fitted`` its final checkpoint, not yet exported)."""
    recorded = recipes.recorded_recipe(out / "recipe.json") or {}
    if any(recorded.get(key) != recipe.get(key) for key in recipes.RECIPE_KEYS):  # the code digest only informs
        return False
    return (exported_model(out)).exists() or (fitted and (out / "checkpoints" / "final.ckpt").exists())


def _last_error(log_file: Path) -> str:
    """The last line of a failed run's log that names an error."""
    lines = [ln.strip() for ln in log_file.read_text(errors="replace").splitlines() if "error" in ln.lower()]
    return lines[-1] if lines else f"see {log_file}"


def _last_rows(metrics: Path) -> dict[str, dict]:
    """``{family: row}`` at the largest step of a ``checkpoint_metrics.jsonl``."""
    from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows

    rows = read_rows(metrics)
    if not rows:
        raise RuntimeError(f"{str(metrics)!r} holds no evaluation rows; the run's evaluation did not run.")
    step = max(int(r["step"]) for r in rows)
    return {r["family"]: r for r in rows if int(r["step"]) == step}


def output_metrics(metrics: Path) -> dict:
    """The output-level numbers of one run: ``{split: {em, es, prob, extraction}}``, ``utility`` and, where the run
    measured them, ``forget_quality``, ``model_utility`` and ``mia`` (``{attack: {auc, privleak}}``)."""
    rows = _last_rows(metrics)
    mem, util = rows["memorization"], rows["retain_drift:utility"]
    out = {s: {k: mem[s][k] for k in ("em", "es", "prob", "extraction_rate")} for s in EVAL_SPLITS}
    out["utility"] = {k: util.get(k) for k in ("ce", "ppl", "delta_ce")}
    tofu, mia = rows.get("tofu") or {}, rows.get("mia")
    out["forget_quality"], out["model_utility"] = tofu.get("forget_quality"), tofu.get("model_utility")
    out["mia"] = mia and {a: {k: v.get(k) for k in ("auc", "privleak")} for a, v in mia.items() if isinstance(v, dict)}
    out["step"] = int(rows["memorization"]["step"])
    return out


def score_args(pre: Path, inj: Path, unl: Path, masks: Path, out: Path, control: tuple[Path, Path] | None = None,
               groups: tuple[Sequence[int], Sequence[int]] | None = None) -> list[str]:  # fmt: skip
    """``lightning-unlearn mask-auc`` arguments scoring one unlearned model (its JSON written to ``out``) against the
    ``(forget, retain)`` groups' masks (``None``: the command's defaults, the paper's six groups)."""
    args = ["mask-auc", "--pre", str(pre), "--inj", str(inj), "--unl", str(unl), "--masks", str(masks)]
    if groups is not None:
        args += ["--forget_groups", json.dumps(list(groups[0])), "--retain_groups", json.dumps(list(groups[1]))]
    if control is not None:
        args += ["--control_inj", str(control[0]), "--control_unl", str(control[1])]
    return [*args, "--out", str(out)]


def resurface_args(model: Path, splits: Path, field: str, out: Path, k: int, epochs: int, seed: int) -> list[str]:
    """``lightning-unlearn lacuna resurface`` arguments of one attack."""
    return ["lacuna", "resurface", "--model", str(model), "--splits", str(splits), "--field", field, "--out",
            str(out), "--k", str(k), "--epochs", str(epochs), "--seed", str(seed)]  # fmt: skip


@dataclass
class _Plan:
    """What every step of one report shares: the testbed, where its runs go, and how each method is run."""

    workdir: str | os.PathLike
    paths: dict[str, Path | None]  # testbed_paths
    out_root: Path
    utility: Path  # utility_records
    methods: Sequence[str]
    epochs: dict[str, int]  # method -> epochs
    lr: float | None
    batch_size: int | None
    control: bool  # run the UnMask controls of the methods that have one
    log: Callable[[str], None]
    reference: Path | None = None  # the testbed's retain reference (lacuna reference), for forget quality / PrivLeak
    groups: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # the testbed's (forget, retain) groups
    method_args: Mapping[str, Mapping[str, object]] | None = None  # method -> its own arguments over its config's

    def run_names(self, method: str) -> list[tuple[str, Path]]:
        """``(run name, starting model)`` of the method's run and, when it has one, of its UnMask control."""
        names = [(method, self.paths["start"])]
        if self.control and METHODS[method][2]:
            names.append((f"{method}_unmask", self.paths["control_start"]))
        return names


def _check_request(
    workdir,
    methods,
    fields,
    epoch_scale: float,
    allow_inseparable: bool,
    log,
    epochs: Mapping[str, int] | None = None,
    method_args: Mapping[str, Mapping] | None = None,
) -> bool | None:
    """Refuse a testbed without a met separability verdict (unless allowed) and unknown methods, fields or scales;
    the testbed's verdict."""
    separable = require_separable(
        workdir,
        allow_inseparable,
        "its ground truth is not established (resetting a group's mask elements makes that group's people forget, "
        "and only them); without it mask AUC, OracleGrad and resurfacing measure the testbed's artifacts, not "
        "localization",
        "score it anyway",
    )
    if separable is not True:
        log("[lacuna] localization: scoring a testbed without a met separability verdict (--allow_inseparable)")
    refused = [m for m in methods if m in REFUSED]
    if refused:
        raise ConfigError(f"method {refused[0]!r} cannot run on a Lacuna testbed: {REFUSED[refused[0]]}.")
    unknown = [m for m in methods if m not in METHODS] + [f for f in fields if f not in TARGET_FIELDS]
    if unknown:
        raise ConfigError(f"unknown method(s) or field(s) {unknown}; methods: {sorted(METHODS)}, fields: "
                         f"{list(TARGET_FIELDS)}.")  # fmt: skip
    if epoch_scale <= 0:
        raise ConfigError(f"epoch_scale={epoch_scale} must be positive.")
    for option, per_method in (("epochs", epochs), ("method_args", method_args)):
        stray = [m for m in per_method or {} if m not in methods]
        if stray:
            raise ConfigError(f"{option} names {stray[0]!r}, which is not among the methods run {list(methods)}; "
                             "name only methods of --methods.")  # fmt: skip
    for method, n in (epochs or {}).items():
        if int(n) < 1 or int(n) != n:
            raise ConfigError(f"epochs[{method!r}]={n} must be a whole number of epochs, at least 1.")
    return separable


def _field_splits(plan: _Plan, field: str, summary: dict) -> Path:
    """The splits ``field`` is unlearned on; opens the field's entry in the summary."""
    splits, filtered = ensure_splits(plan.workdir, field)
    if not filtered:
        plan.log(f"[localization] the memorization filter kept no {field} forget/retain pair; using {splits}")
    summary["fields"][field] = {"splits": str(splits), "filtered": filtered,
                                "split_sizes": split_sizes(splits, field), "methods": {}}  # fmt: skip
    return splits


def _clear_stale_run(out: Path, method_root: Path) -> None:
    """Remove what a run of another recipe left in ``out``, and what was made from its weights: the method's score
    (its control's too) and the run's attack."""
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    shutil.rmtree(exported_model(out).parent, ignore_errors=True)
    (out / "checkpoint_metrics.jsonl").unlink(missing_ok=True)
    (method_root / "mask_auc.json").unlink(missing_ok=True)
    shutil.rmtree(out / "resurfacing", ignore_errors=True)


def _fit_jobs(plan: _Plan, fields: Sequence[str], summary: dict) -> tuple[dict[tuple[str, str], dict], list]:
    """Steps 1-2: every fit (and the ``validate`` of the starting model) not finished before, as jobs; and every run,
    ``{(field, run name): {out, start, recipe}}``."""
    paths = plan.paths
    runs: dict[tuple[str, str], dict] = {}
    todo = []
    for field in fields:
        splits = _field_splits(plan, field, summary)
        field_root = plan.out_root / field
        before = field_root / "before"
        # the starting model's rows: a `validate` with the same evaluators (GA's config: no masks needed)
        args = fit_command("ga", paths["start"], splits, field, before, 1, paths["masks"], plan.lr, plan.batch_size,
                           evaluators(splits, field, plan.utility, before, before=True, reference=plan.reference),
                           stage="validate")  # fmt: skip
        if not (before / "checkpoint_metrics.jsonl").exists():
            todo.append((args, before / "run.log"))
        for method in plan.methods:
            for name, start in plan.run_names(method):
                out = field_root / name
                # the controls are only scored by their weights; the methods also get the output-level evaluation
                cbs = evaluators(splits, field, plan.utility, out, reference=plan.reference) if name == method else []
                args = fit_command(method, start, splits, field, out, plan.epochs[method], paths["masks"], plan.lr,
                                   plan.batch_size, cbs, forget_groups=plan.groups and plan.groups[0],
                                   model_args=(plan.method_args or {}).get(method))  # fmt: skip
                recipe = args.recipe()
                runs[(field, name)] = {"out": out, "start": start, "recipe": recipe}
                if _recipe_matches(out, recipe, fitted=True):
                    plan.log(f"[localization] {field}/{name}: finished before, reusing it")
                    continue
                _clear_stale_run(out, field_root / method)
                recipes.record_recipe(out / "recipe.json", recipe)
                todo.append((args, out / "fit.log"))
    return runs, todo


def _export_runs(runs: dict[tuple[str, str], dict], summary: dict, log: Callable[[str], None]) -> None:
    """Export every fitted run's final checkpoint. A control that failed (e.g. MemFlex selecting no tensor on the
    control's gradients) is dropped from ``runs``, its method scored without the contrast families, and the summary
    says so; a method run without its checkpoint is an error."""
    for (field, name), run in list(runs.items()):
        out = run["out"]
        if (
            name.endswith("_unmask")
            and not (exported_model(out)).exists()
            and not (out / "checkpoints" / "final.ckpt").exists()
        ):
            error = _last_error(out / "fit.log")
            log(f"[localization] {field}/{name}: the control run failed ({error}); scored without contrast families")
            summary["fields"][field].setdefault("control_errors", {})[name] = error
            del runs[(field, name)]
    for run in runs.values():
        out = run["out"]
        if not (exported_model(out)).exists():
            ckpt = out / "checkpoints" / "final.ckpt"
            if not ckpt.exists():
                raise RuntimeError(f"the run wrote no {str(ckpt)!r} (did it stop early? see {out / 'fit.log'}).")
            export_checkpoint(ckpt, run["start"], exported_model(out))
            shutil.rmtree(out / "checkpoints")  # weights and optimizer state (≈ 12 bytes a weight): the export is kept


def _score_jobs(plan: _Plan, field: str, runs: dict[tuple[str, str], dict]) -> list:
    """Step 3: the ``mask-auc`` job of each method's run of ``field`` whose score is missing or was made with other
    arguments."""
    paths, jobs = plan.paths, []
    for method in plan.methods:
        out = plan.out_root / field / method
        ctrl = None
        if (field, f"{method}_unmask") in runs:
            ctrl = (paths["control_start"], exported_model(runs[(field, f"{method}_unmask")]["out"]))
        args = score_args(paths["pre"], paths["start"], exported_model(out), paths["masks"],
                          out / "mask_auc.json", ctrl, plan.groups)  # fmt: skip
        recorded = out / "mask_auc.args.json"
        if not ((out / "mask_auc.json").exists() and recorded.exists() and json.loads(recorded.read_text()) == args):
            (out / "mask_auc.json").unlink(missing_ok=True)
            write_text_atomically(recorded, json.dumps(args))
            jobs.append((args, out / "mask_auc.log"))
    return jobs


def _attack_jobs(plan: _Plan, field: str, splits: Path, k: int, relearn_epochs: int, seed: int) -> list:
    """Step 4: the resurfacing attack of the starting model and of each method's model of ``field``, unless done with
    the same arguments."""
    field_root, jobs = plan.out_root / field, []
    targets = [("before", plan.paths["start"])]
    targets += [(method, exported_model(field_root / method)) for method in plan.methods]
    for name, model in targets:
        attack = field_root / name / "resurfacing"
        args = resurface_args(model, splits, field, attack, k, relearn_epochs, seed)
        recorded = field_root / name / "resurface.args.json"
        if not ((attack / "resurfacing.json").exists() and recorded.exists()
                and json.loads(recorded.read_text()) == args):  # fmt: skip
            (attack / "resurfacing.json").unlink(missing_ok=True)
            write_text_atomically(recorded, json.dumps(args))
            jobs.append((args, field_root / name / "resurface.log"))
    return jobs


def _collect(plan: _Plan, runs: dict[tuple[str, str], dict], summary: dict, resurfacing: bool) -> None:
    """Put every field's output-level rows, scores and attacks into the summary."""
    for field, entry in summary["fields"].items():
        field_root = plan.out_root / field
        for method in plan.methods:
            out = field_root / method
            result = json.loads((out / "mask_auc.json").read_text())
            entry["methods"][method] = {"restricted_to_mF": METHODS[method][1],
                                        "control": (field, f"{method}_unmask") in runs, "epochs": plan.epochs[method],
                                        "output": output_metrics(out / "checkpoint_metrics.jsonl"),
                                        "auc": result}  # fmt: skip
            plan.log(f"[localization] {field}/{method}: AUC(F) max {result['F']['max']:.3f} ({result['F']['best']})")
        if resurfacing:
            for name in ["before", *plan.methods]:
                report = json.loads((field_root / name / "resurfacing" / "resurfacing.json").read_text())
                target = entry if name == "before" else entry["methods"][name]
                target["resurfacing"] = report
            entry["resurfacing_sanity"] = resurfacing_sanity(entry["resurfacing"])
            plan.log(f"[localization] {format_sanity(field, entry['resurfacing_sanity'])}")


def run_localization(
    workdir: str | os.PathLike,
    methods: Sequence[str] = LACUNA_METHODS,
    fields: Sequence[str] = TARGET_FIELDS,
    epoch_scale: float = 1.0,
    lr: float | None = None,
    batch_size: int | None = None,
    control: bool = True,
    resurfacing: bool = True,
    k: int = K,
    relearn_epochs: int = 10,
    seed: int = 0,
    parallel: int = 2,
    in_process: bool = False,
    out_dir: str | os.PathLike | None = None,
    log: Callable[[str], None] = logger.info,
    allow_inseparable: bool = False,
    epochs: Mapping[str, int] | None = None,
    method_args: Mapping[str, Mapping[str, object]] | None = None,
) -> dict:
    """Unlearn every field with every method, evaluate, score, attack; write the report; returns the summary.

    Args:
        workdir: testbed work directory (``lightning-unlearn lacuna run``).
        methods: keys of :data:`METHODS` (default: Lacuna's five, :data:`LACUNA_METHODS`); ``dpo`` is refused
            (the splits hold no preferred answers: use ``idk_dpo``).
        fields: PII fields whose splits are unlearned.
        epoch_scale: multiplies every method's Table 5 epochs (200 for OracleGrad, GA and SimNPO and for the
            methods Lacuna does not run, 20 for MemFlex, one pass for AlphaEdit), at least 1.
        epochs: epochs of the methods named, instead of their scaled Table 5 epochs (e.g. ``{oracle_grad: 15}``, a
            count chosen on a validation field as the paper chose Table 5's); their UnMask controls get the same.
        method_args: the named methods' own arguments over their configs' (e.g. ``{oracle_grad: {gamma: 1.0}}``),
            for the method and its control; recorded in the summary and the report.
        lr: learning rate of every method (``None``: each config's, Table 5).
        batch_size: forget pairs per step (``None``: each config's).
        control: also run every method but OracleGrad on the UnMask control (contrast families).
        resurfacing: run the resurfacing attack on every unlearned model.
        k: sampled continuations per forget prompt in the attack (Lacuna: 200).
        relearn_epochs: epochs of the attack's relearning (the instruction tuning's 10).
        seed: seed of the attack's relearning and sampling.
        parallel: runs at a time (subprocesses of ``cores / parallel`` threads each; ``OMP_NUM_THREADS``, where set,
            caps the cores).
        in_process: run everything in this process, one after the other (tests).
        out_dir: where runs and the report go; default ``<workdir>/localization``.
        log: progress lines.
        allow_inseparable: score a testbed whose separability verdict (``lacuna run``) is not met, or was never
            measured; its numbers then measure the testbed's artifacts, and the summary says so.
    """
    separable = _check_request(workdir, methods, fields, epoch_scale, allow_inseparable, log, epochs, method_args)
    started = time.time()
    paths = testbed_paths(workdir)
    out_root = Path(out_dir) if out_dir else Path(workdir) / "localization"
    utility = utility_records(paths["data"], out_root / "utility.jsonl")
    has_control = control and any(METHODS[m][2] for m in methods)
    if has_control and paths["control_start"] is None:
        raise MissingPathError(
            f"the testbed in {str(workdir)!r} has no UnMask control (instruct_unmasked/ or inject_unmasked/), which "
            "the contrast families need; build it with `lightning-unlearn lacuna run --workdir "
            f"{workdir} --control true` (the finished stages are reused), or pass --control false."
        )
    epochs = {m: method_epochs(m, epoch_scale, epochs) for m in methods}
    from lightning_unlearn.workflows.lacuna.reference import ensure_reference

    # the retain reference of forget quality and PrivLeak (refused on the same terms as this report)
    reference = ensure_reference(workdir, allow_inseparable)
    groups = data_forget_retain_groups(paths["data"])
    plan = _Plan(workdir, paths, out_root, utility, methods, epochs, lr, batch_size, has_control, log, reference,
                 groups, method_args)  # fmt: skip
    jobs = _Jobs(parallel, in_process, log)
    summary: dict = {"workdir": str(workdir), "methods": list(methods), "epochs": epochs, "lr": lr, "k": k,
                     "method_args": {m: dict(a) for m, a in (method_args or {}).items()},
                     "relearn_epochs": relearn_epochs, "seed": seed, "separable": separable,
                     "fields": {}}  # fmt: skip

    # 1-2. Every fit (and the validate of the starting model), as many side by side as `parallel` allows; a failed
    # control leaves its method without the contrast families, a failed method run stops the report.
    runs, todo = _fit_jobs(plan, fields, summary)
    jobs.run(todo, optional=[runs[key]["out"] / "fit.log" for key in runs if key[1].endswith("_unmask")])
    _export_runs(runs, summary, log)
    # 3. Localization and 4. resurfacing: both are jobs of the same pool. A score is reused while its recorded
    # arguments match; an attack's result is kept with its run.
    late = []
    for field in fields:
        entry = summary["fields"][field]
        entry["before"] = output_metrics(out_root / field / "before" / "checkpoint_metrics.jsonl")
        late += _score_jobs(plan, field, runs)
        if resurfacing:
            late += _attack_jobs(plan, field, Path(entry["splits"]), k, relearn_epochs, seed)
    jobs.run(late)
    _collect(plan, runs, summary, resurfacing)
    if resurfacing:
        summary["resurfacing_sanity_holds"] = all(e["resurfacing_sanity"]["holds"] for e in summary["fields"].values())
    summary["seconds"] = round(time.time() - started, 1)
    write_text_atomically(out_root / "summary.json", json.dumps(summary, indent=1))
    write_text_atomically(out_root / "report.md", format_report(summary))
    plot_report(summary, out_root / "report.png")
    return summary


def _cell(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def _leak_cell(attack: dict | None, relearned: bool) -> str:
    """``leaked/profiles (lo–hi)``: an attack's count before (``relearned`` false) or after relearning, with the
    Wilson 95 % interval of its rate."""
    if not attack:
        return "–"
    key, ci = ("leaked_profiles", "leak_rate_ci95") if relearned else ("leaked_profiles_unlearned",
                                                                     "leak_rate_unlearned_ci95")  # fmt: skip
    lo, hi = attack[ci]
    return f"{attack[key]}/{attack['forget_profiles']} ({lo:.2f}–{hi:.2f})"


def format_table(entry: dict) -> str:
    """Markdown table of one field's AUCs: one row per (method, label), a column per family, the max and the best."""
    head = ["method", "label", *FAMILIES, "max", "best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, res in entry["methods"].items():
        auc = res["auc"]
        omitted = set(auc.get("omitted", ()))
        for key in ("F", "F|R"):
            if key in auc:
                values = [f"({_cell(auc[key].get(f))})" if f in omitted and auc[key].get(f) is not None
                          else _cell(auc[key].get(f)) for f in FAMILIES]  # fmt: skip
                label = key.replace("|", "∨")  # a bare | would split the Markdown cell
                row = [LABELS[method], label, *values, _cell(auc[key]["max"]), str(auc[key]["best"])]
                lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


FIELD_METRIC_HEADS = ("forget quality", "MIA AUC (loss)", "PrivLeak (loss)")


def field_metric_cells(output: dict) -> list[str]:
    """The field's numbers of one run (:data:`FIELD_METRIC_HEADS`): TOFU's forget quality against the testbed's
    reference, the LOSS attack's AUC on the forget people vs held-out people, and its PrivLeak (MUSE: near 0 = as
    the reference, −100 = fully detectable); "–" where the run did not measure them."""
    loss = (output.get("mia") or {}).get("loss") or {}
    fq = output.get("forget_quality")
    return [
        "–" if fq is None else f"{fq:.3g}",
        _cell(loss.get("auc")),
        "–" if loss.get("privleak") is None else f"{loss['privleak']:+.1f}",
    ]


def format_outputs(entry: dict) -> str:
    """Markdown table of one field's output-level results: per split EM / ES / Prob / extraction, utility and
    resurfacing, before unlearning and after each method."""
    head = ["method", *[f"{s} EM / ES / Prob / extr." for s in EVAL_SPLITS], "utility CE (Δ)", *FIELD_METRIC_HEADS,
            "AUC(F)", "AUC(F∨R)", "leak unlearned", "leak relearned"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(label: str, output: dict, auc: dict | None, attack: dict | None) -> str:
        cells = [label]
        for s in EVAL_SPLITS:
            m = output[s]
            cells.append(" / ".join(f"{m[k]:.2f}" for k in ("em", "es", "prob", "extraction_rate")))
        u = output["utility"]
        cells.append(f"{u['ce']:.3f} ({u['delta_ce']:+.3f})" if u.get("delta_ce") is not None else f"{u['ce']:.3f}")
        cells += field_metric_cells(output)
        cells += [_cell(auc["F"]["max"]) if auc else "–", _cell(auc["F|R"]["max"]) if auc and "F|R" in auc else "–"]
        cells += [_leak_cell(attack, relearned=False), _leak_cell(attack, relearned=True)]
        return "| " + " | ".join(cells) + " |"

    lines.append(row("before unlearning", entry["before"], None, entry.get("resurfacing")))
    for method, res in entry["methods"].items():
        lines.append(row(LABELS[method], res["output"], res["auc"], res.get("resurfacing")))
    return "\n".join(lines)


def format_overview(summary: dict) -> str:
    """Markdown table of every field and method in one: forget and retain extraction, utility ΔCE, the AUC maxima
    (with the best family) and the resurfacing counts, the starting model's row first in each field."""
    head = ["field", "model", "forget extr.", "forget para. extr.", "retain extr.", "utility ΔCE",
            *FIELD_METRIC_HEADS, "AUC(F) max", "AUC(F∨R) max", "leak unlearned", "leak relearned"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    for field, entry in summary["fields"].items():
        rows = [("before", entry["before"], None, entry.get("resurfacing"))]
        rows += [(LABELS[m], r["output"], r["auc"], r.get("resurfacing")) for m, r in entry["methods"].items()]
        for label, output, auc, attack in rows:
            delta = output["utility"].get("delta_ce")
            cells = [field, label, _cell(output["forget"]["extraction_rate"]),
                     _cell(output["forget_paraphrase"]["extraction_rate"]), _cell(output["retain"]["extraction_rate"]),
                     "–" if delta is None else f"{delta:+.2f}", *field_metric_cells(output)]  # fmt: skip
            for key in ("F", "F|R"):
                cells.append(f"{_cell(auc[key]['max'])} ({auc[key]['best']})" if auc and key in auc else "–")
            cells += [_leak_cell(attack, relearned=False), _leak_cell(attack, relearned=True)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_report(summary: dict) -> str:
    """The whole report as Markdown: per field, the split sizes, the output-level table and the AUC table."""
    parts = ["# Lacuna localization report", ""]
    epochs = ", ".join(f"{LABELS[m]} {e}" for m, e in summary["epochs"].items())
    changed = "; ".join(f"{LABELS[m]} " + ", ".join(f"{k} {v}" for k, v in a.items())
                        for m, a in summary.get("method_args", {}).items())  # fmt: skip
    if changed:
        epochs += f". Arguments over the shipped configs: {changed}"
    parts.append(f"Epochs: {epochs}. Resurfacing: relearn {summary['relearn_epochs']} epochs on the held-out "
                 "relearning split, validated on its own held-out profiles, the best validation checkpoint "
                 f"attacked; K = {summary['k']} samples per forget prompt, seed {summary['seed']}. "
                 "A profile leaks when its PII appears in at least one sample; 'leak unlearned' counts the same "
                 "before relearning. Leak counts carry the Wilson 95 % interval of their rate.")  # fmt: skip
    sanity = [format_sanity(f, e["resurfacing_sanity"]) for f, e in summary["fields"].items()
              if "resurfacing_sanity" in e]  # fmt: skip
    if sanity:
        parts += ["", *[f"**{line}**" for line in sanity]]
    parts += ["", "## Every field", "", format_overview(summary)]
    for field, entry in summary["fields"].items():
        sizes = ", ".join(f"{k} {v}" for k, v in entry["split_sizes"].items())
        kind = (
            "memorization-filtered" if entry["filtered"] else "unfiltered, since the memorization filter kept no pair"
        )
        parts += ["", f"## {field}", "", f"Splits ({kind}): {sizes} rows.", "", format_outputs(entry), "",
                  format_table(entry)]  # fmt: skip
        warnings = sorted({w for res in entry["methods"].values() for w in res["auc"].get("warnings", [])})
        parts += [f"\nwarning: {w}" for w in warnings]
    parts.append(f"\nWall time: {summary['seconds']:.0f} s (runs finished before were reused).")
    return "\n".join(parts) + "\n"


def plot_report(summary: dict, out: Path) -> Path:
    """Bar chart: per field, each method's AUC(F) max and its resurfacing rates (unlearned, relearned) with their
    Wilson 95 % intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fields = list(summary["fields"])
    methods = summary["methods"]
    fig, axes = plt.subplots(1, len(fields), figsize=(4.2 * len(fields), 3.6), squeeze=False, sharey=True)
    width = 0.27
    for ax, field in zip(axes[0], fields, strict=True):
        entry = summary["fields"][field]["methods"]
        xs = range(len(methods))
        auc = [entry[m]["auc"]["F"]["max"] for m in methods]
        ax.bar([x - width for x in xs], auc, width, label="AUC(F) max")
        if all("resurfacing" in entry[m] for m in methods):
            for offset, key, label in ((0, "leak_rate_unlearned", "unlearned"), (width, "leak_rate", "relearned")):
                rates = [entry[m]["resurfacing"][key] for m in methods]
                cis = [entry[m]["resurfacing"][f"{key}_ci95"] for m in methods]
                # intervals written before wilson_interval held its rate (3e-17 above a rate of 0) draw as zero
                err = [[max(0.0, r - lo) for r, (lo, _) in zip(rates, cis)],
                       [max(0.0, hi - r) for r, (_, hi) in zip(rates, cis)]]  # fmt: skip
                ax.bar([x + offset for x in xs], rates, width, yerr=err, capsize=2, label=f"leak rate, {label}")
        ax.axhline(0.5, color="grey", lw=0.8, ls="--")
        ax.set_xticks(list(xs), [LABELS[m] for m in methods], rotation=30, ha="right")
        ax.set_title(field)
        ax.set_ylim(0, 1.05)
    axes[0][0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out)
    return out


def localization_command(
    *,
    workdir: str = "runs/lacuna",
    methods: tuple[Method, ...] = LACUNA_METHODS,
    fields: tuple[Field, ...] = TARGET_FIELDS,
    epoch_scale: float = 1.0,
    lr: float | None = None,
    batch_size: int | None = None,
    control: bool = True,
    resurfacing: bool = True,
    k: int = K,
    relearn_epochs: int = 10,
    seed: int = 0,
    parallel: int = 2,
    out: str | None = None,
    allow_inseparable: bool = False,
    epochs: dict[str, int] | None = None,
    method_args: dict[str, dict[str, float | int | str | bool]] | None = None,
) -> str:
    """Lacuna's findings on a testbed: its five methods (or others by name) and fields, outputs, mask AUC, resurfacing.

    Unlearns with OracleGrad (restricted to m^F), GA, SimNPO, MemFlex and AlphaEdit (their UnMask controls too),
    or with the methods named (RMU, IdkDPO, UNDIAL, IdkNLL, WGA, SatImp also run, with their UnMask controls),
    evaluates forget / retain / paraphrase EM, ES, Prob, extraction and utility, scores each weight change against
    m^F and m^F ∨ m^R, attacks each model by relearning, and writes ``summary.json``, ``report.md`` and
    ``report.png``; the result is the Markdown report.

    Args:
        workdir: testbed work directory (``lightning-unlearn lacuna run``).
        methods: the methods to run (default: Lacuna's five; also rmu, idk_dpo, undial, idk_nll, wga, satimp).
        fields: the PII fields to unlearn, one after the other.
        epoch_scale: multiplies every method's Table 5 epochs (at least 1).
        lr: learning rate of every method (default: each config's).
        batch_size: forget pairs per step (default: each config's).
        control: also run every method but OracleGrad on the UnMask control (contrast families).
        resurfacing: attack every unlearned model (relearn, then sample).
        k: sampled continuations per forget prompt (Lacuna: 200).
        relearn_epochs: epochs of the attack's relearning.
        seed: seed of the attack.
        parallel: runs side by side.
        out: where the runs and the report go (default: ``<workdir>/localization``).
        allow_inseparable: score a testbed whose separability verdict is not met (its numbers are then artifacts).
        epochs: epochs of the methods named instead of their scaled Table 5 epochs, e.g. ``'{oracle_grad: 15}'``
            (their controls get the same); choose them on a validation field, as the paper chose Table 5's.
        method_args: the named methods' own arguments over their configs', e.g. ``'{oracle_grad: {gamma: 1.0}}'``
            (their controls get the same); in the summary and the report.
    """
    with processes.terminate_children_on_exit():  # SIGTERM / SIGHUP end the running fits too
        summary = run_localization(workdir, methods, fields, epoch_scale, lr, batch_size, control, resurfacing, k,
                                   relearn_epochs, seed, parallel, out_dir=out,
                                   allow_inseparable=allow_inseparable, epochs=epochs,
                                   method_args=method_args)  # fmt: skip
    return format_report(summary)


__all__ = [
    "LACUNA_METHODS",
    "METHODS",
    "ensure_splits",
    "export_checkpoint",
    "format_overview",
    "format_report",
    "format_table",
    "plot_report",
    "run_localization",
    "score_args",
]
