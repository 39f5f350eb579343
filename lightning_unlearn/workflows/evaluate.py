"""``lightning-unlearn evaluate RUN_DIR``: evaluate the saved checkpoints of a run after training.

Training evaluates each checkpoint as it is saved; this command does the same later, so a run whose evaluation
failed, or a metric added after the fact, needs no re-training. For every saved step of ``RUN_DIR`` — a Lightning
checkpoint file (full weights, or an adapter run's trainable weights), else an ``adapter-step=N/`` peft directory,
else a ``merged-step=N/`` model — it runs one ``validate`` of the run's own ``config.yaml`` (LightningCLI saves it
in the run directory), with the ``-c`` files merged over it: an ``eval.yaml`` whose ``trainer.callbacks`` lists
other evaluators replaces the run's. The evaluators write into the run's ``checkpoint_metrics.jsonl`` (and its
TensorBoard directory) exactly the rows the in-training callbacks write, keyed by the checkpoint's step; a (step,
family) row already in the file is not recomputed, and ``CheckpointSelection`` re-selects over all rows. Base-model
quantities (SCE base labels, retain base CE) come from a checkpoint's callback state when one holds them, as in
training, else they are computed once and reused for every step.

Every ``validate`` is a ``LightningCLI`` run of the same config in this process. Under a strategy of several
processes (``--overrides '[--trainer.devices, 2, --trainer.strategy, ddp]'``, ``-c trainer/fsdp_cpu.yaml``, or a
run trained so) Lightning's launcher starts the other ranks once, at the first ``validate``; each rank then runs
this whole command, every later ``validate`` joins the same process group, and rank 0 writes the rows. Which rows
exist is read once, before anything is written, so every rank computes the same families. Tested under DDP and
FSDP2 (2 CPU processes, gloo): the single-process rows to ≤ 1e-6 and the same text. ``adapters_per_pass`` is one
process only.
A step saved only as ``merged-step=N/`` (OracleGrad with LoRA, whose masked delta is no peft adapter) is evaluated
on the configured network: its adapted layers add the dense change ``W_merged − W`` while the adapter is on, so the
model computes the merged one and ``disable_adapter()`` still gives the start model for base-model quantities (KL).
"""

from __future__ import annotations

import logging
import re
import tempfile
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.workflows.command import dispatch

log = logging.getLogger("lightning_unlearn")

_STEP = re.compile(r"(?:^|[-_])step=(\d+)")


@dataclass(frozen=True)
class SavedCheckpoint:
    """One saved step of a run: ``kind`` is ``checkpoint`` (a Lightning file or sharded directory), ``adapter``
    (a peft ``adapter-step=N/`` directory) or ``merged`` (OracleGrad's ``merged-step=N/`` model)."""

    step: int
    path: Path
    kind: str


def saved_checkpoints(run_dir: str | Path) -> list[SavedCheckpoint]:
    """Every saved step under ``run_dir``, one entry per step, ascending; a checkpoint file wins over a directory
    of the same step, an adapter directory over a merged one. ``last.ckpt`` counts under its own step."""
    run_dir = Path(run_dir)
    rank = {"checkpoint": 0, "adapter": 1, "merged": 2}
    found: dict[int, SavedCheckpoint] = {}

    def offer(candidate: SavedCheckpoint) -> None:
        held = found.get(candidate.step)
        if held is None or (rank[candidate.kind], candidate.path.name.startswith("last")) < (
            rank[held.kind],
            held.path.name.startswith("last"),
        ):
            found[candidate.step] = candidate

    for path in sorted(run_dir.rglob("*.ckpt")):
        if path.is_file() and not zipfile.is_zipfile(path):  # truncated (a killed or full-disk write) or not torch's
            log.warning("evaluate: skipping %s: not a complete checkpoint file (truncated or foreign); the other "
                        "steps are evaluated. Delete it, or re-save that step, to evaluate it.", path)  # fmt: skip
            continue
        step = _checkpoint_step(path)
        if step is not None:
            offer(SavedCheckpoint(step, path, "checkpoint"))
    for kind in ("adapter", "merged"):
        for saved in _saved_directories(run_dir, kind):
            offer(saved)
    return [found[s] for s in sorted(found)]


def saved_adapters(run_dir: str | Path) -> list[SavedCheckpoint]:
    """Every ``adapter-step=N/`` directory under ``run_dir``, ascending, also of steps a checkpoint file holds too
    (a LoRA run keeps its last checkpoint file beside every step's adapter: the same weights)."""
    return sorted(_saved_directories(Path(run_dir), "adapter"), key=lambda c: c.step)


def _saved_directories(run_dir: Path, kind: str):
    """The ``adapter-step=N/`` (kind ``adapter``) or ``merged-step=N/`` (``merged``) directories under ``run_dir``."""
    prefix = f"{kind}-step="
    for path in sorted(run_dir.rglob(f"{prefix}*")):
        if path.is_dir() and path.name[len(prefix) :].isdigit():
            yield SavedCheckpoint(int(path.name[len(prefix) :]), path, kind)


def _checkpoint_step(path: Path) -> int | None:
    """The ``global_step`` of a checkpoint: from a ``step=N`` file name, else from the file itself."""
    match = _STEP.search(path.stem)
    if match and not path.stem.startswith("last"):
        return int(match.group(1))
    if not path.is_file():
        return None
    import torch

    try:
        return int(torch.load(str(path), map_location="cpu", weights_only=True, mmap=True).get("global_step", 0))
    except Exception:  # noqa: BLE001 - an unreadable file is not a saved step; the log says so
        log.warning("evaluate: skipping %s, which is not a readable checkpoint", path)
        return None


def _saved_bases(checkpoints: list[SavedCheckpoint]) -> dict[str, dict]:
    """``{callback state key: base}`` from the newest checkpoint file that carries evaluator states."""
    import torch

    for saved in reversed(checkpoints):
        if saved.kind != "checkpoint" or not saved.path.is_file():
            continue
        try:
            state = torch.load(str(saved.path), map_location="cpu", weights_only=True, mmap=True).get("callbacks") or {}
        except Exception:  # noqa: BLE001 - an unreadable checkpoint carries no bases; another one may
            log.warning("evaluate: cannot read %s; its base-model quantities are not reused", saved.path)
            continue
        bases = {k: v["base"] for k, v in state.items() if isinstance(v, dict) and v.get("base")}
        if bases:
            return bases
    return {}


def _require_writable(run_dir: Path) -> None:
    """Raise the OS error of writing into ``run_dir`` (read-only, full, no permission) before any model is loaded:
    later the rows and TensorBoard's writer thread would fail one after the other, the second with a traceback."""
    try:
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".evaluate-probe-"):
            pass
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(run_dir)) from None


def _require_model(run_config: Path, overrides: list[str]) -> None:
    """The starting model the run's config names must still be there (every checkpoint is evaluated on it); one line
    naming the config's key and the fix when it is gone, rather than a tokenizer's or a checkpoint's complaint."""
    from lightning_unlearn.configs.yaml_files import read_yaml

    if any(word.startswith("--model.init_args.model_path") for word in overrides):
        return
    config = read_yaml(run_config) or {}
    path = ((config.get("model") or {}).get("init_args") or {}).get("model_path")
    if isinstance(path, str) and not Path(path).expanduser().exists():
        raise MissingPathError(
            f"evaluate: the run's starting model {path!r} (model.init_args.model_path in {run_config}) is gone; "
            "restore it there, or give its new place with --overrides '[--model.init_args.model_path, DIR, "
            "--data.init_args.tokenizer_path, DIR]'."
        )


def evaluate_command(
    run_dir: Path,
    *,
    eval_config: list[Path] | None = None,
    run_config: Path | None = None,
    steps: list[int] | None = None,
    overrides: list[str] | None = None,
    adapters_per_pass: int = 1,
) -> dict:
    """Evaluate every saved checkpoint of a run with its config's callbacks (or -c eval.yaml's); add missing rows.

    Args:
        run_dir: the run's directory: where its ``checkpoint_metrics.jsonl`` lives (its logger's version
            directory, e.g. ``runs/lens/.../npo/trajectory``); saved checkpoints are found beneath it.
        eval_config: YAML files merged over the run's config, in order (``-c eval.yaml``, repeatable); a
            ``trainer.callbacks`` list in one replaces the run's evaluators.
        run_config: the run's own config (default: ``RUN_DIR/config.yaml``, which LightningCLI saved).
        steps: evaluate only these steps (default: every saved one).
        overrides: further ``--key value`` words for every ``validate`` (e.g. ``[--trainer.devices, 2]``).
        adapters_per_pass: SCE of up to this many ``adapter-step=N/`` checkpoints from one generation pass
            (mixed-adapter batches: the suite once per adapter in each ``generate``; one process only), a step's
            adapter directory taken even where a checkpoint file of that step exists; the other families still run
            per checkpoint.

    Returns:
        ``{"run_dir", "evaluated": [{"step", "source", "families"}], "skipped": [{"step", "reason"}],
        "metrics_file"}``.
    """
    from lightning_unlearn.callbacks.checkpoint_metrics_file import METRICS_FILE, read_rows

    run_dir = Path(run_dir).expanduser()
    if not run_dir.is_dir():
        raise MissingPathError(f"evaluate: run directory {run_dir} does not exist.")
    _require_writable(run_dir)
    run_config = Path(run_config).expanduser() if run_config is not None else run_dir / "config.yaml"
    if not run_config.is_file():
        raise MissingPathError(
            f"evaluate: {run_config} not found; LightningCLI saves a run's config.yaml in its log directory. Pass "
            "the run's version directory as RUN_DIR, or its config with --run_config."
        )
    _require_model(run_config, overrides or [])
    from lightning_unlearn.configs import resolve_config

    extra = [Path(resolve_config(str(c))).expanduser() for c in eval_config or []]
    for c in extra:
        if not c.is_file():
            raise MissingPathError(
                f"evaluate: config {c} not found (neither a file nor a shipped config; `lightning-unlearn configs "
                "list` names those)."
            )
    checkpoints = saved_checkpoints(run_dir)
    if steps is not None:
        wanted = set(steps)
        missing = sorted(wanted - {c.step for c in checkpoints})
        if missing:
            raise ConfigError(f"evaluate: no saved checkpoint of step(s) {missing} under {run_dir}.")
        checkpoints = [c for c in checkpoints if c.step in wanted]
    if not checkpoints:
        raise MissingPathError(
            f"evaluate: no saved checkpoint under {run_dir} (no *.ckpt file, adapter-step=N/ or merged-step=N/)."
        )
    if adapters_per_pass < 1:
        raise ConfigError(f"evaluate: adapters_per_pass={adapters_per_pass} must be at least 1.")
    metrics_file = run_dir / METRICS_FILE
    bases = _saved_bases(checkpoints)
    result: dict = {"run_dir": str(run_dir), "evaluated": [], "skipped": [], "metrics_file": str(metrics_file)}
    # Read once, before anything is written: under DDP / FSDP every rank runs this command, rank 0 writes the rows,
    # and every rank must choose the same families to compute (the evaluators' collectives pair up across ranks).
    rows = read_rows(metrics_file)
    done = {(int(r["step"]), r["family"]) for r in rows}
    # an adapter or merged directory carries no epoch: take it from the run's own rows of that step
    epochs = {int(r["step"]): r["epoch"] for r in rows if r.get("epoch") is not None and r.get("fn") == "fit"}
    if adapters_per_pass > 1:
        wanted = {c.step for c in checkpoints}
        adapters = [c for c in saved_adapters(run_dir) if c.step in wanted]
        for start in range(0, len(adapters), adapters_per_pass):
            chunk = adapters[start : start + adapters_per_pass]
            written = _sce_for_adapters(run_dir, run_config, extra, chunk, done, bases, overrides or [], epochs)
            for step, families in written.items():
                path = next(str(c.path) for c in chunk if c.step == step)
                result["evaluated"].append({"step": step, "source": path, "families": families, "mixed": True})
                done |= {(step, family) for family in families}
    configured: set[str] | None = None  # the config's families, known after the first validate (each uses it)
    for saved in checkpoints:
        families_done = {family for step, family in done if step == saved.step}
        if configured is not None and configured <= families_done:  # no model to load for nothing
            result["skipped"].append({"step": saved.step, "reason": "every family already has its row"})
            continue
        cli = _validate(run_dir, run_config, extra, saved, families_done, bases, overrides or [], epochs)
        bases.update(cli.bases)
        configured = cli.configured
        if cli.families:
            result["evaluated"].append({"step": saved.step, "source": str(saved.path), "families": cli.families})
        else:
            result["skipped"].append({"step": saved.step, "reason": "every family already has its row"})
    return result


def _sce_for_adapters(
    run_dir: Path,
    run_config: Path,
    extra: list[Path],
    chunk: list[SavedCheckpoint],
    done: set[tuple[int, str]],
    bases: dict[str, dict],
    overrides: list[str],
    epochs: dict[int, int],
) -> dict[int, list[str]]:
    """The SCE rows of several adapter checkpoints from one mixed-adapter generation pass; ``{step: families}``."""
    import json
    import tempfile

    import yaml

    from lightning_unlearn.callbacks.checkpoint_metrics_file import use_run_output_dir
    from lightning_unlearn.callbacks.sce_evaluation import SCEEvaluation
    from lightning_unlearn.cli import UnlearnCLI

    # Without a subcommand LightningCLI parses the classes only: the saved fit config's own options (ckpt_path,
    # weights_only, …) are dropped.
    config = yaml.safe_load(run_config.read_text(encoding="utf-8")) or {}
    config = {k: v for k, v in config.items() if k in ("seed_everything", "trainer", "model", "data")}
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "config.yaml"
        plain.write_text(yaml.safe_dump(config), encoding="utf-8")
        args = ["-c", str(plain)]
        for c in extra:
            args += ["-c", str(c)]
        logger = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"}
        logger["init_args"] = {"save_dir": str(run_dir), "name": "", "version": "", "default_hp_metric": False}
        args += ["--trainer.logger", json.dumps(logger), "--model.init_args.adapter.path", str(chunk[0].path)]
        cli = UnlearnCLI(args=[*args, *overrides], run=False, save_config_callback=None)
    trainer, module = cli.trainer, cli.model
    use_run_output_dir(trainer, run_dir)
    evaluators = [cb for cb in trainer.callbacks if isinstance(cb, SCEEvaluation)]
    model = module.model  # the base with the first adapter ("default"), built now
    names = {chunk[0].step: model.active_adapter}
    for saved in chunk[1:]:
        name = f"step={saved.step}"
        model.load_adapter(str(saved.path), adapter_name=name)
        names[saved.step] = name
    from lightning_unlearn.callbacks.checkpoint_selection import CheckpointSelection

    selections = [cb for cb in trainer.callbacks if isinstance(cb, CheckpointSelection)]
    for cb in selections:
        cb.setup(trainer, module, "validate")  # re-selects after each row (on_checkpoint_evaluated)
    written: dict[int, list[str]] = {}
    for cb in evaluators:
        todo = {step: name for step, name in names.items() if (step, cb.family_name) not in done}
        if not todo:
            continue
        cb.setup(trainer, module, "validate")
        cb.base = dict(bases.get(cb.state_key, {}))
        cb.known_epochs = dict(epochs)
        cb.ensure_base(trainer, module)
        bases[cb.state_key] = cb.base
        log.info("evaluate: %s of steps %s in one mixed-adapter pass", cb.family_name, sorted(todo))
        cb.evaluate_adapters(trainer, module, todo)
        for step in todo:
            written.setdefault(step, []).append(cb.family_name)
    return written


def _validate(
    run_dir: Path,
    run_config: Path,
    extra: list[Path],
    saved: SavedCheckpoint,
    done: set[str],
    bases: dict[str, dict],
    overrides: list[str],
    epochs: dict[int, int],
):
    """One ``validate`` of the run's config on one saved step; returns the finished CLI object."""
    import json

    from lightning.pytorch import Callback

    from lightning_unlearn.cli import UnlearnCLI

    class MergedWeights(Callback):
        """A ``validate`` of a ``merged-step=N/`` model: the configured network (start weights, a fresh adapter)
        computes the merged model while its adapter is on and the start model with it off, as in training."""

        def on_validation_start(self, trainer, pl_module) -> None:
            from lightning_unlearn.objectives.oracle_grad import load_merged_delta

            load_merged_delta(pl_module.model, saved.path)

    class EvaluateCLI(UnlearnCLI):
        """``validate`` into the run's own directory, evaluating only the families the step still lacks."""

        def __init__(self, *args, **kwargs) -> None:
            self.families: list[str] = []  # evaluated now
            self.configured: set[str] = set()  # every family the config evaluates
            self.bases: dict[str, dict] = {}
            super().__init__(*args, **kwargs)  # parses, instantiates and runs validate

        def before_validate(self) -> None:
            from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
            from lightning_unlearn.callbacks.checkpoint_metrics_file import use_run_output_dir
            from lightning_unlearn.callbacks.quantization_attack import EvaluatorAttack

            trainer = self.trainer
            use_run_output_dir(trainer, run_dir)
            if trainer.global_rank == 0:
                log.info("evaluate: step %d with %s on %d process(es)", saved.step, type(trainer.strategy).__name__,
                         trainer.world_size)  # fmt: skip
            kept, dropped = [], []
            for cb in trainer.callbacks:
                if isinstance(cb, CheckpointEvaluator):
                    self.configured.add(cb.family_name)
                    cb.base = dict(bases.get(cb.state_key, {}))
                    if cb.family_name in done:
                        dropped.append(cb)
                        continue  # this step's row of that family exists: not recomputed
                    cb.known_epochs = dict(epochs)
                    if saved.kind != "checkpoint":
                        cb.step_override = saved.step
                    self.families.append(cb.family_name)
                kept.append(cb)
            for cb in kept:  # an attack runs the run's evaluators under it, those whose own rows exist too
                if isinstance(cb, EvaluatorAttack):
                    cb.besides = dropped
            if saved.kind == "merged":
                kept.insert(0, MergedWeights())
            trainer.callbacks = kept

        def after_validate(self) -> None:
            from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator

            self.bases = {cb.state_key: cb.base for cb in self.trainer.callbacks if isinstance(cb, CheckpointEvaluator)}

    # verbose false: Lightning's table of validation metrics would print before the command's JSON result on stdout
    args = ["validate", "--verbose", "false", "-c", str(run_config)]
    for c in extra:
        args += ["-c", str(c)]
    # TensorBoard events of the evaluation go into the run's own directory, beside training's; no hp_metric -1
    # session there (TensorBoard's HParams view would take its columns from it), CheckpointSelection records one.
    logger = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"}
    logger["init_args"] = {"save_dir": str(run_dir), "name": "", "version": "", "default_hp_metric": False}
    args += ["--trainer.logger", json.dumps(logger)]
    if saved.kind == "checkpoint":
        args += ["--ckpt_path", str(saved.path)]
    elif saved.kind == "adapter":
        args += ["--model.init_args.adapter.path", str(saved.path)]
    # merged: the configured model, made to compute the merged one by MergedWeights
    args += overrides
    log.info("evaluate: step %d from %s", saved.step, saved.path)
    with warnings.catch_warnings():
        # the command line is this command's (`evaluate RUN`, `attack quantize RUN`), not validate's: Lightning's
        # advice against passing both is for a script, and its DDP launcher must still re-run sys.argv as it is
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
        return EvaluateCLI(args=args, save_config_callback=None)


def main(argv: list[str] | None = None) -> None:
    """``lightning-unlearn evaluate RUN_DIR [-c eval.yaml]...``: see :func:`evaluate_command`.

    ``-c FILE`` / ``--config FILE`` name configs merged over the run's (as with ``fit -c``), so they become
    ``--eval_config`` here rather than a config of this command.
    """
    import sys

    words = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    i = 0
    while i < len(words):
        if words[i] in ("-c", "--config") and i + 1 < len(words):
            rest.append(f"--eval_config+={words[i + 1]}")
            i += 2
            continue
        if words[i].startswith("--config="):
            rest.append(f"--eval_config+={words[i].split('=', 1)[1]}")
        else:
            rest.append(words[i])
        i += 1
    dispatch(evaluate_command, rest, "lightning-unlearn evaluate")
