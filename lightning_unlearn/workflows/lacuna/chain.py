"""The Lacuna testbed chain: ``lightning-unlearn lacuna run`` (and ``lacuna data``, its first step alone).

The whole built-in chain in a work directory — pretrain → inject (masked) and the UnMask control → instruct (both) →
filter (both) → separability. Each training stage is a ``lightning-unlearn fit -c lacuna/<stage>.yaml`` run with the
work directory's paths; a finished stage (its export exists) is reused and says so, an interrupted one resumes from
its last checkpoint (:func:`~lightning_unlearn.checkpoints.latest_checkpoint`). A stage whose recorded recipe
(``<stage>/recipe.json``: config text and overrides, :mod:`~lightning_unlearn.workflows.recipes`) differs from this
run's, or that is older than an input rebuilt after it, is refused rather than reused; one built by other package code
(the recipe's source digest) is reused with a warning, since changed code defaults are in no config.
``--model_path DIR`` (or ``smollm2``) starts both injections from a real model instead of the built-in θ_pre and
skips pretraining; ``--pretrain_config FILE`` / ``--inject_config FILE`` / ``--instruct_config FILE`` add a YAML
overlay to the pretraining / both injections / both instruction tunings (e.g. a learning rate). The log shows
extraction after instruction tuning and on θ_inj before it, so what instruction tuning costs is visible; the command
ends with one line per verdict and writes the full result to ``<workdir>/chain_result.json``.

The other steps live beside it: :mod:`.filter`, :mod:`.resurface`, :mod:`.locality`, :mod:`.localization`;
:mod:`.commands` dispatches ``lightning-unlearn lacuna <command>``.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

from lightning_unlearn.atomic import write_text_atomically
from lightning_unlearn.configs import config_root, resolve_config
from lightning_unlearn.data.templates import TARGET_FIELDS
from lightning_unlearn.data.testbed_data import LacunaDataConfig, build_testbed_data, data_forget_retain_groups
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.smollm2 import resolve_model_dir
from lightning_unlearn.workflows import processes, recipes
from lightning_unlearn.workflows.fit_command import FitCommand
from lightning_unlearn.workflows.lacuna.filter import filter_stage
from lightning_unlearn.workflows.lacuna.separability import (
    format_separability,
    separability_report,
    separability_verdict,
    write_report,
)
from lightning_unlearn.workflows.lacuna.testbed_layout import TestbedPaths, exported_model

logger = logging.getLogger("lightning_unlearn")

CONFIG_DIR = config_root() / "lacuna"
# Whether `lacuna run` builds the UnMask control by default.
CONTROL_BY_DEFAULT = False
# Why the default chain has no instruction stage (`--instruct true` adds it).
NO_INSTRUCT_REASON = (
    "The injected QA already use the probe's wording, so θ_inj answers the probes itself, and validated on held-out "
    "profiles no instruction adapter beats the untrained model (docs/results/lacuna_memorization.md §1): the stage "
    "kept θ_inj unchanged. The splits are built from θ_inj; --instruct true runs the stage (and builds them from its "
    "model)."
)

# Overrides of the YAML defaults per size preset. "default" is the built-in main job: θ_pre derived from SmolLM2
# (pretrain.yaml), then two groups of 16 people (forget group 0, retain group 1) injected with the separable-groups
# recipe (lacuna/inject_separable.yaml over inject.yaml; docs/results/lacuna_memorization.md §9d-§9i), the one layout
# measured separable here (about 18 min on 2 CPU cores). "inject_config" overlays the masked injection only: the UnMask
# control keeps inject_unmasked.yaml's recipe (group dropout and held QA need masks). "six_groups" is the paper's layout
# (60 people, forget groups 0-2, retain 3-5; inject.yaml alone, about 19 min): it memorizes and keeps general text, but
# it is NOT separable (§9c). "tiny" is for tests (seconds): a random tiny θ_pre (pretrain_tiny.yaml).
SIZES: dict[str, dict[str, list[str]]] = {
    "default": {
        "data": ["--data.data.num_groups", "2", "--data.data.num_profiles", "32"],
        "inject_config": ["lacuna/inject_separable.yaml"],
        "pretrain": [], "inject": ["--model.init_args.num_groups", "2"], "instruct": [],
    },
    "six_groups": {"pretrain": [], "inject": [], "instruct": []},
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
# The stage chain
# ---------------------------------------------------------------------------------------------------------------


def _fit_cmd(config: str, root: Path, overrides: list[str], overlays: Sequence[Path] = ()) -> FitCommand:
    """The stage's fit of the shipped ``config`` with its ``overlays`` and ``overrides``, in ``root``."""
    return FitCommand([CONFIG_DIR / config, *overlays], root, overrides)


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
            raise ConfigError(
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


def require_separable(
    workdir: str | os.PathLike, allow_inseparable: bool, consequence: str, anyway: str
) -> bool | None:
    """The testbed's separability verdict; raise unless it is met or ``allow_inseparable``. The message says why
    the verdict is missing, what ``consequence`` follows, and that --allow_inseparable true does ``anyway``."""
    if not TestbedPaths(Path(workdir)).masks.exists() and not (Path(workdir) / "chain.json").exists():
        raise MissingPathError(
            f"{str(workdir)!r} holds no Lacuna testbed (no chain.json, no inject/export); build one there first: "
            f"`lightning-unlearn lacuna run --workdir {workdir}`, or pass the --workdir of an existing one."
        )
    separable = testbed_separable(workdir)
    if separable is not True and not allow_inseparable:
        why = "was never measured (built before the check existed)" if separable is None else "is NOT met"
        raise ConfigError(
            f"the testbed in {str(workdir)!r}: its separability verdict {why}, so {consequence}. Rebuild it "
            f"(`lightning-unlearn lacuna run --workdir {workdir}` prints the verdict), or pass --allow_inseparable "
            f"true to {anyway}."
        )
    return separable


@dataclass
class _Stages:
    """The chain's stages in one work directory: which finished ones are reused, and running the others."""

    workdir: Path
    log: Callable[[str], None]
    parallel: bool
    threads: int  # what the stages running at a time share (processes.thread_budget)

    def note(self, message: str) -> None:
        """A progress line of the chain."""
        self.log(f"[lacuna] {message}")

    def reused(self, path: Path, stage: str, cmd: FitCommand | None = None, inputs: Sequence[Path] = ()) -> bool:
        """Whether ``stage`` finished before: its output ``path`` exists and is newer than its ``inputs``.

        A training stage (``cmd`` given) must match the recipe it was built with, and any stage must be newer than
        the outputs it was made from (else one of them was rebuilt after it). A stale training stage is an error
        (rebuilding it is the user's call); a stale filter, seconds of work, is measured again.
        """
        if cmd is not None:
            _check_recipe(stage, cmd.root, cmd.recipe(self.workdir), path.exists(), self.log)
        if not path.exists():
            return False
        newer = [i for i in inputs if i.exists() and i.stat().st_mtime_ns > path.stat().st_mtime_ns]
        if newer and cmd is not None:
            raise ConfigError(
                f"stage {stage}: {str(path)!r} is older than its input {str(newer[0])!r}, which was rebuilt after it. "
                f"Delete {str(path)!r} to rebuild it from the new input, or choose another --workdir."
            )
        if newer:
            self.note(f"{stage}: {path} is older than {newer[0]}; measuring again")
            return False
        self.note(f"{stage}: finished before, reusing {path}")
        return True

    def run(self, stages: list[tuple[str, FitCommand, Path]]) -> None:
        """Run ``(name, command, root)`` stages that are independent of each other: on ≥ 2 cores side by side,
        sharing the cores.

        On a terminal the first shows its progress bar here and the others write their output to ``<root>/stage.log``.
        When this process's output goes to a file (nohup, SLURM, ``> log``), every stage writes its whole output to
        its ``stage.log`` and its progress lines (:class:`~lightning_unlearn.callbacks.LogProgress`) come here too.
        """
        procs = []
        begun = time.time()
        threads = max(1, self.threads // max(1, len(stages))) if self.parallel else self.threads
        to_terminal = sys.stdout.isatty()
        for i, (name, fit, root) in enumerate(stages):
            root.mkdir(parents=True, exist_ok=True)
            cmd = fit.argv()
            # The whole command (a few hundred characters of paths and overrides) goes to a file, not the terminal.
            write_text_atomically(root / "command.txt", shlex.join(cmd) + "\n")
            shown = " -c ".join(c.name for c in fit.configs)
            in_file = not to_terminal or (self.parallel and i > 0)
            where = f"; full log: {root / 'stage.log'}" if in_file else ""
            self.note(f"{name}: lightning-unlearn fit -c {shown} … (whole command: {root / 'command.txt'}{where})")
            if in_file:
                if self.parallel and i > 0:
                    self.note(f"{name}: running alongside")
                proc = processes.spawn_stage(cmd, threads, root / "stage.log")
                follower = None
                if not to_terminal:
                    follower = processes.follow_progress(root / "stage.log", proc, partial(self._progress, name))
                procs.append((name, proc, root, follower))
            else:
                procs.append((name, processes.spawn_stage(cmd, threads), root, None))
            if not self.parallel:
                self._finish(*procs[-1])
                self.note(f"{name}: finished in {time.time() - begun:.0f} s")
        for name, proc, root, follower in procs if self.parallel else ():
            self._finish(name, proc, root, follower)
            together = " (side by side)" if len(stages) > 1 else ""
            self.note(f"{name}: finished after {time.time() - begun:.0f} s{together}")

    def _progress(self, name: str, line: str) -> None:
        self.note(f"{name}: {line}")

    def _finish(self, name: str, proc, root: Path, follower) -> None:
        """Wait for a stage; a failed one raises with the end of its log (where it has one)."""
        code = proc.wait()
        if follower is not None:
            follower.join()
        if code == 0:
            return
        log_file = root / "stage.log"
        if log_file.exists():
            tail = log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            self.note(f"{name}: the last lines of {log_file}:\n" + "\n".join(f"    {line}" for line in tail))
        hint = f" (see {log_file})" if log_file.exists() else ""
        raise RuntimeError(f"stage {name} failed with exit code {code}{hint}.")


def _pretrain_config(preset: dict[str, list[str]]) -> str:
    return preset.get("pretrain_config", ["pretrain.yaml"])[0]


def _pretrain(
    stages: _Stages, preset: dict[str, list[str]], data_args: list[str], base: Path | None, overlays: list[Path]
) -> Path:
    """θ_pre: ``base`` when given (the data is built first, so that the injections side by side do not both write
    it), else the pretraining stage's export (built now unless reused)."""
    w = stages.workdir
    if base is not None:
        stages.note(f"pretrain: skipped; both injections start from {base}")
        build_testbed_data(w / "data", _data_config(preset.get("data", [])), log=stages.note)
        return base
    pre_model = TestbedPaths(w).pre_model
    # where the stage keeps what it builds before training: the tiny θ_pre's tokenizer, the derived model
    keep = ["--model.tokenizer_path", str(w / "tokenizer")] if preset.get("pretrain_config") else [
        "--model.derive.path", str(w / "base")]  # fmt: skip
    cmd = _fit_cmd(_pretrain_config(preset), w / "pretrain", [*data_args, *keep, *preset["pretrain"]], overlays)
    if not stages.reused(pre_model, "pretrain", cmd):
        stages.run([("pretrain", cmd, w / "pretrain")])
    return pre_model


def _inject(stages: _Stages, pre_model: Path, data_args: list[str], preset_args: list[str], overlays: list[Path],
            control_overlays: list[Path], control: bool) -> None:  # fmt: skip
    """The masked injection with ``overlays`` (and with ``control`` the unmasked one with ``control_overlays``, side by
    side) from ``pre_model``."""
    w, todo = stages.workdir, []
    injections = (("inject", "inject.yaml", overlays),
                  ("inject_unmasked", "inject_unmasked.yaml", control_overlays))[: 2 if control else 1]  # fmt: skip
    for name, config, extra in injections:
        overrides = [*data_args, "--model.model_path", str(pre_model), *preset_args]
        cmd = _fit_cmd(config, w / name, overrides, extra)
        if not stages.reused(TestbedPaths(w).inj(unmasked=name != "inject"), name, cmd, [pre_model]):
            todo.append((name, cmd, w / name))
    stages.run(todo)


def _instruct(stages: _Stages, data_args: list[str], preset_args: list[str], overlays: list[Path],
              control: bool) -> None:  # fmt: skip
    """The instruction tuning of each injected model, side by side."""
    w, todo = stages.workdir, []
    tunings = (("instruct", "inject"), ("instruct_unmasked", "inject_unmasked"))[: 2 if control else 1]
    for name, source in tunings:
        source_model = TestbedPaths(w).inj(unmasked=source != "inject")
        overrides = [*data_args, "--model.model_path", str(source_model), *preset_args]
        cmd = _fit_cmd("instruct.yaml", w / name, overrides, overlays)
        if not stages.reused(exported_model(w / name), name, cmd, [source_model]):
            todo.append((name, cmd, w / name))
    stages.run(todo)


def _filter_targets(w: Path, instruct: bool, control: bool) -> list[tuple[str, Path, Path, bool]]:
    """``(report, model, output directory, writes the splits)`` of every filter: the splits come from the masked
    model the chain ends with; θ_inj is measured too when instruction tuning followed it."""
    t = TestbedPaths(w)
    if not instruct:
        targets = [("masked", t.inj(), t.splits, True)]
        if control:
            targets.append(("unmasked", t.inj(unmasked=True), w / "filter_unmasked", False))
        return targets
    targets = [("masked", t.instructed(), t.splits, True), ("masked_inj", t.inj(), w / "filter_inj", False)]
    if control:
        targets += [
            ("unmasked", t.instructed(unmasked=True), w / "filter_unmasked", False),
            ("unmasked_inj", t.inj(unmasked=True), w / "filter_inj_unmasked", False),
        ]
    return targets


def _filter(stages: _Stages, targets: list[tuple[str, Path, Path, bool]]) -> dict[str, dict]:
    """The filter report of every target, measured unless a report newer than its model exists."""
    reports = {}
    for name, model, out, write in targets:
        if stages.reused(out / "extraction.json", f"filter ({name})", inputs=[model]):
            reports[name] = json.loads((out / "extraction.json").read_text())
            continue
        stages.note(f"filter ({name}): measuring extraction with {model}")
        begun = time.time()
        reports[name] = filter_stage(str(model), str(stages.workdir / "data"), str(out), write_splits=write)
        stages.note(f"filter ({name}): finished in {time.time() - begun:.0f} s")
    return reports


def _separability(stages: _Stages) -> dict:
    """The separability report of the masked injection (``separability.json``), measured unless reused."""
    w = stages.workdir
    export = TestbedPaths(w).export("inject")
    if stages.reused(w / "separability.json", "separability", inputs=[export / "inj"]):
        return json.loads((w / "separability.json").read_text())
    stages.note(f"separability: resetting each group's mask elements of {export / 'inj'} to θ_pre")
    begun = time.time()
    report = separability_report(export, w / "data")
    write_report(report, w / "separability.json")
    stages.note(f"separability: finished in {time.time() - begun:.0f} s")
    return report


def chain_verdicts(reports: dict) -> dict[str, str]:
    """One line per target of the testbed (``memorization``, ``splits``, ``separability``) from :func:`run_chain`'s
    reports: met or NOT met, and why."""
    return {
        "memorization": target_verdict(reports["masked"]),
        "splits": split_verdict(reports["masked"]["split_sizes"]),
        "separability": separability_verdict(reports["separability"]),
    }


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
    pretrain_configs: Sequence[str] = (),
) -> dict:
    """Run (or reuse) every stage of the chain in ``workdir``; returns the filter reports.

    The reports are ``masked`` (θ_inj, or with ``instruct`` the instruction-tuned model; it also wrote the splits),
    with ``instruct`` ``masked_inj`` (θ_inj, measured before instruction tuning, no splits); with the control,
    ``unmasked`` (and ``unmasked_inj``) too; and
    ``separability`` (:mod:`~lightning_unlearn.workflows.lacuna.separability`, also in ``separability.json``), whose
    verdict joins the memorization and split verdicts (:func:`chain_verdicts`) in ``chain.json``.

    Args:
        workdir: where every stage writes (data, stage roots, splits).
        size: a :data:`SIZES` preset.
        parallel: run independent stages side by side (default: with ≥ 2 cores).
        log: where progress lines go.
        model_path: start both injections from this local HF model (or ``"smollm2"``) and skip pretraining;
            ``None`` uses the built-in θ_pre (the size preset's pretraining config).
        inject_configs: YAML overlays added after ``inject.yaml``/``inject_unmasked.yaml``.
        instruct_configs: YAML overlays added after ``instruct.yaml`` (both instruction tunings).
        pretrain_configs: YAML overlays added after the pretraining config (refused with ``model_path``, which
            skips pretraining).
        control: also build the UnMask control (``inject_unmasked.yaml``, then its instruction tuning and filters),
            side by side with the masked stages. A work directory built without it can add it later.
        instruct: run the instruction stage (``instruct.yaml``) and build the splits from its model; the default
            chain has none (:data:`NO_INSTRUCT_REASON`).
    """
    if size not in SIZES:
        raise ConfigError(f"size {size!r} is not one of {sorted(SIZES)}.")
    overlays = _overlays(inject_configs, "--inject_config")
    masked_overlays = _overlays(SIZES[size].get("inject_config", []), "--inject_config") + overlays
    instruct_overlays = _overlays(instruct_configs, "--instruct_config")
    pretrain_overlays = _overlays(pretrain_configs, "--pretrain_config")
    if pretrain_overlays and model_path is not None:
        raise ConfigError(
            "--pretrain_config overlays the pretraining stage, which --model_path skips (the injections start from "
            "that model); drop one of them."
        )
    w = Path(workdir).resolve()
    preset = SIZES[size]
    data_dir = ["--data.data_dir", str(w / "data")]
    base = resolve_model_dir(model_path, "--model_path") if model_path is not None else None
    _check_provenance(
        w,
        {
            "size": size,
            "model": str(base) if base else f"built-in ({_pretrain_config(preset)})",
            "inject_configs": [str(o) for o in masked_overlays],
            "instruct_configs": [str(o) for o in instruct_overlays],
            **({"pretrain_configs": [str(o) for o in pretrain_overlays]} if pretrain_overlays else {}),
            **({"instruct": False} if not instruct else {}),
        },
    )
    started = time.time()
    cores = os.cpu_count() or 1
    stages = _Stages(w, log, cores >= 2 if parallel is None else parallel, processes.thread_budget())
    data_args = [*data_dir, *preset.get("data", [])]
    pre_model = _pretrain(stages, preset, data_args, base, pretrain_overlays)
    _inject(stages, pre_model, data_args, preset["inject"], masked_overlays, overlays, control)
    if instruct:
        _instruct(stages, data_dir, preset["instruct"], instruct_overlays, control)
    else:
        stages.note(f"instruct: skipped. {NO_INSTRUCT_REASON}")
    reports = _filter(stages, _filter_targets(w, instruct, control))
    log(format_table(*(reports.get(n) for n in ("masked", "unmasked", "masked_inj", "unmasked_inj"))))
    log(format_split_sizes(reports["masked"]["split_sizes"], *data_forget_retain_groups(w / "data")))
    reports["separability"] = _separability(stages)
    log(format_separability(reports["separability"]))
    _record_verdicts(w, chain_verdicts(reports), reports["separability"]["met"])
    stages.note(f"done in {time.time() - started:.0f} s; splits in {w / 'splits'}")
    return reports


def target_verdict(masked: dict, rate: float = 0.5, fields: int = 2) -> str:
    """Whether the masked model meets Lacuna's memorization target: ≥ ``rate`` extraction on ≥ ``fields`` fields."""
    met = [f for f in TARGET_FIELDS if masked["extraction"][f] >= rate]
    verdict = "met" if len(met) >= fields else "NOT met"
    detail = ", ".join(met) if met else "none"
    line = f"[lacuna] target (masked, ≥ {rate:.0%} on ≥ {fields} fields): {verdict}; fields at or above: {detail}"
    if len(met) < fields:
        line += " (docs/results/lacuna_memorization.md: what was measured, and the real-model path)"
    return line


def _overlays(configs: Sequence[str], flag: str) -> list[Path]:
    # a local file, else a shipped config by name (lacuna/inject_smollm2.yaml)
    overlays = [Path(resolve_config(c)).expanduser().resolve() for c in configs]
    for given, overlay in zip(configs, overlays, strict=True):
        if not overlay.is_file():
            raise MissingPathError(f"{flag} {given!r} does not exist; pass a YAML file or a shipped config name.")
    return overlays


def format_table(
    masked: dict, unmasked: dict | None = None, masked_inj: dict | None = None, unmasked_inj: dict | None = None
) -> str:
    """Extraction rate per field as a text table: the masked model after instruction tuning, and (when given) on
    θ_inj before it, each beside the UnMask control's when that was built."""
    after = [c for c in (masked, unmasked) if c is not None]
    before = [c for c in (masked_inj, unmasked_inj) if c is not None] if masked_inj is not None else []
    names = ["masked", "unmasked"][: len(after)]
    groups = [("after instruction tuning", after), ("θ_inj, before it", before)] if before else []
    # columns wide enough that each group's heading (two spaces apart) spans its own columns only
    width = max(12, *(-(-(len(heading) + 2) // len(cs)) for heading, cs in groups)) if groups else 12
    lines = [f"Extraction rate per field ({masked['profiles']} profiles; greedy answer contains the PII value)"]
    if groups:
        lines.append(f"{'':<18}" + "".join(f"{heading:>{width * len(cs)}}" for heading, cs in groups))
    lines.append(f"{'field':<18}" + "".join(f"{n:>{width}}" for n in names) * (1 + bool(before)))
    for f in TARGET_FIELDS:
        lines.append(f"{f:<18}" + "".join(f"{c['extraction'][f]:>{width}.2%}" for c in after + before))
    return "\n".join(lines)


def format_split_sizes(
    sizes: dict[str, int], forget_groups: Sequence[int] = (0, 1, 2), retain_groups: Sequence[int] = (3, 4, 5)
) -> str:
    """Rows of every memorization-filtered split, one line per field, as a text table."""
    columns = ("forget", "retain", "forget_paraphrase", "retain_paraphrase", "tune_forget", "tune_retain")
    span = lambda g: f"{g[0]}-{g[-1]}" if len(g) > 1 else f"{g[0]}"  # noqa: E731
    which = f"forget: groups {span(list(forget_groups))}, retain: groups {span(list(retain_groups))}"
    lines = [f"Memorization-filtered splits (rows; {which}, cross-field)",
             f"{'field':<18}" + "".join(f"{c:>19}" for c in columns)]  # fmt: skip
    for f in TARGET_FIELDS:
        lines.append(f"{f:<18}" + "".join(f"{sizes[f'{f}/{c}']:>19}" for c in columns))
    lines.append(f"relearn: {sizes['relearn']} rows (held-out profiles, for the resurfacing attack)")
    if "mia/members" in sizes:
        lines.append(
            f"membership inference: {sizes['mia/members']} member rows (forget people), {sizes['mia/nonmembers']} "
            "non-member rows (held-out people of the forget groups, never trained on)"
        )
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


RESULT_FILE = "chain_result.json"  # in the work directory: the full result of `lacuna run`


def chain_result(reports: dict) -> dict:
    """What ``lacuna run`` keeps of :func:`run_chain`'s reports: the extraction rate per field of each measured model,
    the separability verdict per reset (and the utility), and the verdict lines."""
    result = {name: report["extraction"] for name, report in reports.items() if name != "separability"}
    sep = reports["separability"]
    result["separability"] = {"met": sep["met"], "utility": sep["utility"],
                              **{name: r["met"] for name, r in sep["resets"].items()}}  # fmt: skip
    result["verdicts"] = chain_verdicts(reports)
    return result


def format_closing(workdir: str | os.PathLike, verdicts: dict[str, str], result_file: str | os.PathLike) -> str:
    """The closing block of ``lacuna run``: each verdict once, and where the full result is."""
    lines = [f"Lacuna testbed in {workdir}:"]
    lines += [f"  {line.removeprefix('[lacuna] ')}" for line in verdicts.values()]
    lines.append(f"Full result (extraction per field of each model, separability per reset): {result_file}")
    return "\n".join(lines)


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
    pretrain_config: list[str] | None = None,
) -> str:
    """Run (or reuse) the whole Lacuna chain: pretrain, inject (and the control), filter, separability.

    Progress and the tables (extraction after instruction tuning and on θ_inj before it, split sizes, separability)
    go to the log; the command ends with one line per verdict and writes the full result (the extraction rate per
    field of each measured model, separability per reset) to ``<workdir>/chain_result.json``.

    Args:
        workdir: work directory of every stage (data, stage roots, splits).
        size: size preset: ``default`` (two groups, separable), ``six_groups`` (the paper's layout, not separable
            here), ``tiny`` (seconds, for tests).
        sequential: never run two stages side by side (default: side by side on two or more cores).
        model_path: start both injections from this local HF model directory (or ``smollm2``) and skip pretraining.
        inject_config: YAML overlays for both injections, e.g. ``lacuna/inject_smollm2.yaml``.
        instruct_config: YAML overlays for both instruction tunings, e.g. one that sets ``model.init_args.optim.lr``.
        pretrain_config: YAML overlays for the pretraining stage (θ_pre), e.g. one that sets ``trainer.max_steps``.
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
            pretrain_configs=pretrain_config or (),
        )
    result = chain_result(reports)
    path = write_text_atomically(Path(workdir) / RESULT_FILE, json.dumps(result, indent=1, ensure_ascii=False))
    return format_closing(workdir, result["verdicts"], path)


def data_command(*, out: str = "runs/lacuna/data", data: LacunaDataConfig | None = None) -> str:
    """Build the Lacuna testbed data directory; the result is its path.

    Args:
        out: the data directory.
        data: what the data is made of (default: :class:`LacunaDataConfig`'s defaults), e.g.
            ``--data.num_profiles 18``.
    """
    return str(build_testbed_data(out, data or LacunaDataConfig(), log=logger.info))


__all__ = [
    "CONFIG_DIR",
    "RESULT_FILE",
    "SIZES",
    "chain_result",
    "chain_verdicts",
    "data_command",
    "format_closing",
    "format_split_sizes",
    "format_table",
    "run_chain",
    "run_command",
    "split_verdict",
    "target_verdict",
    "testbed_separable",
]
