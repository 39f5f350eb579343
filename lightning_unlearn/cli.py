"""The ``lightning-unlearn`` entry point: LightningCLI for ``fit``/``validate``/``test``/``predict``, plus the
non-Trainer commands (listed in ``EXTRA_COMMANDS``) dispatched before LightningCLI sees the arguments.

Each non-Trainer command is a typed function exposed through ``jsonargparse.auto_cli`` (see
:mod:`lightning_unlearn.workflows.command`), so all take ``-c/--config FILE``, ``--print_config`` and ``--help``
with LightningCLI's underscore flags. This module only names them: it imports no workflow until one is run.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import gc
import importlib
import importlib.util
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from typing_extensions import override

from lightning_unlearn.configs.parse_errors import exit_in_one_line
from lightning_unlearn.console import quiet_third_party
from lightning_unlearn.errors import UserError

# Non-Trainer commands: name -> ("module:function", one-line description). The function takes the remaining argv;
# the description is the first docstring line of the command function (tests/test_cli.py checks they agree).
EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "report": (
        "lightning_unlearn.workflows.report:main",
        "Cross-run SCE heatmap and checkpoint-selection table of one or more run directories.",
    ),
    "sweep": (
        "lightning_unlearn.workflows.sweep:main",
        "Run every cell of a sweep file on its executor; finished cells are skipped, interrupted ones resumed.",
    ),
    "evaluate": (
        "lightning_unlearn.workflows.evaluate:main",
        "Evaluate every saved checkpoint of a run with its config's callbacks (or -c eval.yaml's); add missing rows.",
    ),
    "attack": (
        "lightning_unlearn.workflows.attack:main",
        "Attacks on a finished run's checkpoints: quantize (its weights rounded to int8 / int4), relearn (a few "
        "fine-tuning steps on related text).",
    ),
    "mask-auc": (
        "lightning_unlearn.workflows.report:mask_auc_main",
        "Localization AUC of one unlearned model against the forget mask, as JSON.",
    ),
    "lens": (
        "lightning_unlearn.workflows.lens:main",
        "LENS steps: base answers, annotation, forget sets, calibration, trajectory summary, rescoring, the whole run.",
    ),
    "lacuna": (
        "lightning_unlearn.workflows.lacuna.commands:main",
        "The Lacuna testbed: the chain, each of its steps, and the localization precision run.",
    ),
    "smollm2": (
        "lightning_unlearn.workflows.smollm2:main",
        "Convert the packaged SmolLM2-135M-Instruct GGUF to an fp32 model directory once; print its path.",
    ),
    "configs": ("lightning_unlearn.workflows.configs:main", "Name the shipped configs, or copy one to edit."),
}
# The subcommands of the commands that have them: name -> one-line description (the function's first docstring line).
SUBCOMMANDS: dict[str, dict[str, str]] = {
    "lens": {
        "baseline": "Generate base answers to a suite and write them as JSONL (plus a .meta.json sidecar).",
        "export": "Write answers as a CSV for annotators: a baseline's L0 answers, or a run's post-unlearning answers.",
        "import": "Build a forget set from baseline answers: strict (manual labels) or weak (a labeler).",
        "label": "Label a baseline file with a labeler; the result is the Reproduced count per level.",
        "calibrate": "Calibrate weak labels against manual ones: the narrative labeler (LENS Table 8) and the validity "
        "detectors.",
        "summary": "One LENS trajectory at its selected checkpoint, as a short table.",
        "rescore": "Re-label and re-score every saved checkpoint generation of one run; returns the new selection.",
        "run": "From a suite file (or a shipped narrative) to a verdict: data, trajectories, report, summaries.",
    },
    "lacuna": {
        "run": "Run (or reuse) the whole Lacuna chain: pretrain, inject (and the control), filter, separability.",
        "data": "Build the Lacuna testbed data directory; the result is its path.",
        "filter": "Measure extraction per field and write the memorization-filtered splits.",
        "resurface": "Resurfacing attack: relearn on held-out PII, then count the forget profiles that leak.",
        "locality": "Locality check: count elements an injection changed inside and outside the groups' masks.",
        "localization": (
            "Lacuna's findings on a testbed: its five methods (or others by name) and fields, outputs, mask AUC, "
            "resurfacing."
        ),
        "reference": "Export the testbed's retain reference (m^F reset to θ_pre) to <workdir>/reference.",
    },
    "attack": {
        "quantize": "The quantization attack on every saved checkpoint of a run (or ``--steps``); rows added to its "
        "metrics file.",
        "relearn": "The relearning attack on every saved checkpoint of a run (or ``--steps``); rows added to its "
        "metrics file.",
    },
    "configs": {
        "list": "Print every shipped config (``group``: only ``lens``, ``lacuna``, ``trainer`` or ``sweeps``).",
        "copy": "Copy the shipped config NAME (e.g. lens/npo.yaml) to DESTINATION (a file or a folder).",
    },
}
# Old spellings, kept for one release: alias -> the command words it stands for. An alias also accepts the old
# dashed flags (--max-new-tokens for --max_new_tokens).
ALIASES: dict[str, tuple[str, ...]] = {
    **{f"lens-{sub}": ("lens", sub) for sub in SUBCOMMANDS["lens"] if sub != "run"},  # `lens run` came later
    "lacuna-localization": ("lacuna", "localization"),
}
# Old flags of the aliases that are not just the dashed spelling of a new one: old -> new words.
RENAMED_FLAGS: dict[str, tuple[str, ...]] = {"--no_control": ("--control", "false")}  # lacuna-localization
# What a workflow command raises for a bad path or value: one line on stderr and a non-zero exit, not a traceback.
# The package's own checks raise UserError; a FileNotFoundError from anywhere is a path the user named that is not
# there. Workflow commands also pass on third-party ValueErrors (a library refusing a value the user gave) in one line.
USER_ERRORS = (UserError, FileNotFoundError, FileExistsError, ValueError)


class _OneLineErrorParser(LightningArgumentParser):
    """A parse error is one line naming the bad key, with the closest valid one ("did you mean …"); the usage dump
    is for ``--help``."""

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error:
            return super().error(message, ex)
        exit_in_one_line(self, message, ex)


class UnlearnCLI(LightningCLI):
    """LightningCLI with subclass mode for models and datamodules, so YAML names them by ``class_path``.

    ``--ckpt_path FILE`` loads weights and training state into the model the config describes: the checkpoint's
    hyperparameters never replace the config (LightningCLI's default re-parses them, which swaps in the
    checkpoint's model). A checkpoint of another model (model path, adapter, masks…) is refused with one line naming
    the first difference; any other changed value (learning rate, loss weights) is applied and logged; a corrupt
    checkpoint is named as such, with the newest readable one beside it. A resumed ``fit`` cannot change ``optim``
    (the restored optimizer state holds the saved learning rate), so that is refused too. Nothing is written before
    these checks.
    """

    def __init__(self, *args, **kwargs) -> None:
        # Imported so jsonargparse knows them as subclasses: `--model NPO`, `--data ForgetRetainDataModule`,
        # `--trainer.callbacks+=SCEEvaluation` and `--trainer.strategy MaskedDDPStrategy` by short name, and
        # listed by `--model.help`.
        import lightning_unlearn.callbacks
        import lightning_unlearn.data.instruction_datamodule
        import lightning_unlearn.data.lacuna_datamodule
        import lightning_unlearn.data.unlearning
        import lightning_unlearn.objectives
        import lightning_unlearn.strategies  # noqa: F401

        kwargs.setdefault("parser_class", _OneLineErrorParser)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        # Every module configures its own AdamW and schedule from `model.init_args.optim`; LightningCLI's
        # --optimizer / --lr_scheduler would be ignored or crash on the empty parameter list, so they are not offered.
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(LightningModule, LightningDataModule, *args, **kwargs)

    @override
    def _run_subcommand(self, subcommand: str) -> None:
        # One run per directory: checkpoints and metric rows of two runs would interleave silently. Only the
        # launching process takes the lock (ranks started by Lightning's launcher carry LOCAL_RANK/RANK > 0), and
        # it is released however the run ends.
        launcher = all(os.environ.get(k, "0") == "0" for k in ("LOCAL_RANK", "RANK", "NODE_RANK"))
        with _user_errors_in_one_line(subcommand):
            # Read and check the data before anything is written (run lock, logger directory, config.yaml): a bad
            # row must leave the run directory as it was.
            preflight = getattr(self.datamodule, "preflight", None)
            if callable(preflight):
                preflight(subcommand)
        if subcommand != "fit" or not launcher:
            self._run_reporting_user_errors(subcommand)
            return
        from lightning_unlearn.checkpoints import RunDirectoryBusy, acquire_run_lock, release_run_lock

        try:
            with _user_errors_in_one_line(subcommand):  # a run directory that cannot be made: one line
                lock = acquire_run_lock(self.trainer.default_root_dir)
        except RunDirectoryBusy as err:
            raise SystemExit(f"lightning-unlearn fit: error: {err}") from None
        from lightning_unlearn.atomic import remove_stale_temporaries

        for tmp in remove_stale_temporaries(self.trainer.default_root_dir):  # this run holds the directory now
            logging.getLogger("lightning_unlearn").info("removed %s, left by an interrupted write", tmp)
        try:
            self._run_reporting_user_errors(subcommand)
        finally:
            release_run_lock(lock)
        if getattr(self.model, "stopped_at_step", None) == 0:  # the stop rule fired before any update
            raise SystemExit(
                f"lightning-unlearn fit: error: the run stopped at its first step ({self.model.stop_reason}): nothing "
                "was trained or saved; check the model's weights, the data and optim.lr."
            )

    def _run_reporting_user_errors(self, subcommand: str) -> None:
        # A check of this package that fires once the data and model meet (a group id outside the masks, a forget
        # set without rows) is a bad input too: one line, not Lightning's traceback. Anything else propagates.
        with _user_errors_in_one_line(subcommand):
            super()._run_subcommand(subcommand)

    @override
    def before_instantiate_classes(self) -> None:
        """Refuse ``fit`` with ``max_steps=0``; let ``validate`` run one batch where the config turns validation off.

        Raises:
            SystemExit: ``fit`` with ``trainer.max_steps=0`` (it would train nothing).
        """
        subcommand = self.config.get("subcommand")
        trainer = self.config.get(subcommand, {}).get("trainer", {}) if subcommand else {}
        if subcommand == "fit" and trainer.get("max_steps") == 0:
            raise SystemExit(
                "lightning-unlearn fit: error: trainer.max_steps=0 trains nothing; set a positive max_steps, or -1 to "
                "let max_epochs decide."
            )
        if subcommand == "validate" and trainer.get("limit_val_batches") in (0, 0.0):
            # A config that turns the validation loop off during fit (the evaluators run at checkpoint saves) would
            # make validate run no epoch, so no evaluator, and exit 0 with no row.
            logging.getLogger("lightning_unlearn").info(
                "validate: limit_val_batches=0 in the config would skip validation and every evaluation callback; "
                "validating one batch of each loader so the callbacks evaluate the checkpoint"
            )
            trainer["limit_val_batches"] = 1

    @override
    def instantiate_classes(self) -> None:
        """Build the model, data and trainer, then install atomic checkpoint writes and pass on the run's records.

        Resume data changes go to the datamodule; ``--run_hparams`` to every ``CheckpointSelection``.

        Raises:
            SystemExit: a user error (bad config value, missing path) while instantiating, as one line.
        """
        # A bad value in the config (a negative learning rate, a missing path) raises inside jsonargparse's
        # instantiation and would surface as 70-110 lines of chained tracebacks: print the one line that says it.
        with _user_errors_in_one_line(self.config.get("subcommand")):
            super().instantiate_classes()
        self._install_atomic_checkpoint_io()
        changes = getattr(self, "_data_changes", None)
        if changes and hasattr(self.datamodule, "data_changes"):
            self.datamodule.data_changes = list(changes)  # kept in every checkpoint this resumed run saves
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        run_hparams = config.get("run_hparams") if config is not None else None
        if run_hparams:
            from lightning_unlearn.callbacks.checkpoint_selection import CheckpointSelection

            for cb in self.trainer.callbacks:
                if isinstance(cb, CheckpointSelection):
                    cb.run_hparams.update(run_hparams)

    @override
    def instantiate_trainer(self, **kwargs):
        """The trainer, with the step-aware progress bar and, for ``fit`` without a terminal, :class:`LogProgress`.

        Neither is added when the config brings its own (or turns the bar off).

        Args:
            **kwargs: LightningCLI's trainer arguments (``callbacks`` given here are used as they are).

        Returns:
            The instantiated ``Trainer``.
        """
        # The step-aware progress bar, unless the config brings its own bar or turns bars off; and progress as log
        # lines where no bar can show it (output to a file, or the bar turned off), unless the config has them.
        from lightning.pytorch.callbacks import ProgressBar

        from lightning_unlearn.callbacks.log_progress import LogProgress
        from lightning_unlearn.callbacks.progress import StepProgressBar

        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        trainer = config.get("trainer") or {}
        callbacks = trainer.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        if "callbacks" in kwargs:
            return super().instantiate_trainer(**kwargs)
        bar = trainer.get("enable_progress_bar", True) is not False
        added = []
        if (
            bar
            and importlib.util.find_spec("rich") is not None
            and not any(isinstance(c, ProgressBar) for c in callbacks)
        ):
            added.append(StepProgressBar())
        if self.subcommand == "fit" and (not bar or not sys.stdout.isatty()):
            added += [] if any(isinstance(c, LogProgress) for c in callbacks) else [LogProgress()]
        if added:
            kwargs["callbacks"] = [*callbacks, *added]
        return super().instantiate_trainer(**kwargs)

    def _install_atomic_checkpoint_io(self) -> None:
        """Single-file checkpoints are written atomically (a full disk leaves the earlier ones intact); a strategy
        with its own checkpoint IO (sharded FSDP directories, a user's plugin) keeps it."""
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

        from lightning_unlearn.checkpoints import atomic_checkpoint_io

        trainer = getattr(self, "trainer", None)
        if trainer is not None and type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = atomic_checkpoint_io()

    @override
    def _parse_ckpt_path(self) -> None:
        from lightning_unlearn.checkpoints import (
            SHARDED_METADATA_FILE,
            CheckpointError,
            latest_checkpoint,
            read_checkpoint,
            resume_conflicts,
        )

        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        ckpt_path = config.get("ckpt_path")
        if ckpt_path == "last":
            # Lightning looks for "last" in the new run's logger version only and, finding nothing there, warns and
            # starts from step 0. Look in the whole run directory instead, or refuse.
            root = config.get("trainer", {}).get("default_root_dir") or "."
            found = latest_checkpoint(root)
            if found is None:
                raise SystemExit(
                    f"lightning-unlearn {subcommand}: error: --ckpt_path last, but {root!r} holds no checkpoint to "
                    "resume from; drop --ckpt_path to start a new run, or pass the run's default_root_dir."
                )
            config["ckpt_path"] = ckpt_path = str(found)
            logging.getLogger("lightning_unlearn").info("resuming from %s", found)
        if ckpt_path and str(ckpt_path) not in ("best", "hpc", "registry") and not Path(str(ckpt_path)).exists():
            raise SystemExit(
                f"lightning-unlearn {subcommand}: error: --ckpt_path {ckpt_path}: no such checkpoint file; give a "
                "saved *.ckpt (or `last` to resume the run in default_root_dir), or drop --ckpt_path."
            )
        if ckpt_path and Path(str(ckpt_path)).is_dir() and not (Path(str(ckpt_path)) / SHARDED_METADATA_FILE).exists():
            raise SystemExit(
                f"lightning-unlearn {subcommand}: error: --ckpt_path {ckpt_path} is a directory but not a sharded "
                f"checkpoint (no {SHARDED_METADATA_FILE} in it); give a saved *.ckpt file or a sharded checkpoint's "
                "directory (or `last`)."
            )
        if not ckpt_path or not Path(str(ckpt_path)).is_file():
            return  # "best" and sharded (directory) checkpoints: Lightning resolves and loads them
        try:
            checkpoint = read_checkpoint(ckpt_path)
        except CheckpointError as err:
            raise SystemExit(f"lightning-unlearn {subcommand}: error: {err}") from None
        saved = checkpoint.get("hyper_parameters") or {}
        model = config.get("model")
        configured = _plain(model.get("init_args")) if model is not None and model.get("init_args") else {}
        refused, changed = resume_conflicts(configured, saved)
        moved = [line for line in refused if line.startswith("model_path:")]
        if moved and _same_weights(checkpoint.get("model_weights_fingerprint"), configured.get("model_path")):
            refused.remove(moved[0])  # the same weights at another path: the model moved, it is not another one
            logging.getLogger("lightning_unlearn").info("the starting model moved (same weights): %s", moved[0])
        saved_class = saved.get("_class_path")
        if saved_class and model is not None and model.get("class_path") not in (None, saved_class):
            refused.insert(0, f"class: checkpoint {saved_class} → configured {model.get('class_path')}")
        if subcommand == "fit":
            # The checkpoint's optimizer and scheduler state carry the saved learning rate: a changed optim would be
            # silently overwritten by the restore, so it is refused instead.
            refused += [line for line in changed if line.startswith("optim:")]
            changed = [line for line in changed if not line.startswith("optim:")]
        if refused:
            raise SystemExit(
                f"lightning-unlearn {subcommand}: error: {ckpt_path} belongs to another model than the configured one "
                f"({refused[0]}); pass that model's config, or a checkpoint of this one."
            )
        for line in changed:
            logging.getLogger("lightning_unlearn").warning("resuming %s with a changed value: %s", ckpt_path, line)
        if subcommand == "fit":
            self._check_data_identity(config, checkpoint, str(ckpt_path))
            _continue_in_the_checkpoints_version(config, Path(str(ckpt_path)))

    def _check_data_identity(self, config, checkpoint: dict, ckpt_path: str) -> None:
        """A resumed fit must see the data it was trained on, in the same order: refuse a changed data file,
        seed, batch size or other order-defining setting (one line naming it) unless ``--allow_data_change true``."""
        from lightning_unlearn.data.fingerprint import data_fingerprint, fingerprint_changes, saved_fingerprint

        saved = saved_fingerprint(checkpoint)
        data = config.get("data")
        if saved is None or data is None or not data.get("init_args"):
            return  # a checkpoint of a datamodule that records no fingerprint (or none configured): nothing to compare
        changes = fingerprint_changes(saved, data_fingerprint(_plain(data.get("init_args"))))
        if not changes:
            return
        if not config.get("allow_data_change"):
            more = f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""
            raise SystemExit(
                f"lightning-unlearn fit: error: {ckpt_path} was trained on other data: {changes[0]}{more}; resuming "
                "would not continue its data order. Restore the data settings, start a new run without --ckpt_path, "
                "or pass --allow_data_change true to resume anyway (recorded in the run's config and checkpoints)."
            )
        for line in changes:
            logging.getLogger("lightning_unlearn").warning("resuming %s on changed data: %s", ckpt_path, line)
        self._data_changes = changes

    @override
    def add_arguments_to_parser(self, parser) -> None:
        """Add ``--allow_data_change`` (resume on changed data) and ``--run_hparams`` (HParams session extras).

        Args:
            parser: the subcommand's jsonargparse parser.
        """
        parser.add_argument(
            "--allow_data_change",
            type=bool,
            default=False,
            help="fit --ckpt_path: resume although the data files or order-defining settings changed since the "
            "checkpoint (refused by default: the data order would no longer be the run's).",
        )
        parser.add_argument(
            "--run_hparams",
            type=dict[str, Any] | None,
            default=None,
            help="further hyperparameters recorded with the run's checkpoint selection in TensorBoard's HParams view "
            "(every CheckpointSelection's run_hparams), e.g. what tells this run from its siblings; `lightning-unlearn "
            "sweep` passes each cell's overrides, name, label and panel.",
        )


_VERSIONED_LOGGERS = ("lightning.pytorch.loggers.TensorBoardLogger", "lightning.pytorch.loggers.CSVLogger")


def _continue_in_the_checkpoints_version(config, ckpt: Path) -> None:
    """A resumed fit writes on in the logger version directory its checkpoint lives in (``<save_dir>/<name>/
    <version>/checkpoints/…``), not in a new ``version_N+1``: checkpoints, metric rows and TensorBoard events of one
    run stay in one place. Applies to the default logger and to a TensorBoard/CSV logger without a fixed version."""
    from jsonargparse import Namespace

    if ckpt.parent.name != "checkpoints":
        return
    log_dir = ckpt.parent.parent
    trainer = config.get("trainer")
    logger = trainer.get("logger") if trainer is not None else None
    root = Path(str(trainer.get("default_root_dir") or ".")).resolve()
    if logger in (None, True) and log_dir.parent.parent.resolve() == root:
        trainer["logger"] = Namespace(
            class_path=_VERSIONED_LOGGERS[0],
            init_args=Namespace(save_dir=str(log_dir.parent.parent), name=log_dir.parent.name, version=log_dir.name),
        )
    elif isinstance(logger, Namespace) and logger.get("class_path") in _VERSIONED_LOGGERS:
        args = logger.get("init_args") or Namespace()
        same_place = Path(str(args.get("save_dir", "."))).resolve() == log_dir.parent.parent.resolve()
        if args.get("version") is None and same_place and args.get("name", "lightning_logs") == log_dir.parent.name:
            args["version"] = log_dir.name
            logger["init_args"] = args
    else:
        return
    logging.getLogger("lightning_unlearn").info("the resumed run continues in %s", log_dir)


@contextlib.contextmanager
def _user_errors_in_one_line(subcommand: str | None):
    """A :func:`_user_error` raised inside ends the command with its one line; anything else propagates."""
    try:
        yield
    except Exception as err:
        cause = _user_error(err)
        if cause is None:
            raise
        raise SystemExit(f"lightning-unlearn {subcommand}: error: {cause}") from None


def _user_error(err: BaseException) -> str | None:
    """The message of the innermost :class:`~lightning_unlearn.errors.UserError` in ``err``'s chain (a check of this
    package on a config value, path or data file), or of a ``FileNotFoundError`` (a path the user named), an OS error
    on the run directory, or Lightning's one-line ``MisconfigurationException``; else ``None`` (a bug keeps its
    traceback)."""
    found, seen = None, set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (UserError, FileNotFoundError)):
            found = str(err)
        if _environment_error(err) is not None:  # the run directory, not a bug
            found = _environment_error(err)
        elif type(err).__name__ == "MisconfigurationException":  # Lightning's own one-line user errors
            found = str(err).strip().splitlines()[0]
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    return found


# OS errors on a path the user chose: what to do about each.
_ENVIRONMENT_ERRORS = {
    errno.ENOTDIR: "a parent of that path is a file: choose another directory (e.g. --trainer.default_root_dir)",
    errno.EISDIR: "that path is a directory: give a file path",
    errno.EEXIST: "that path is a file, not a directory: choose a directory (e.g. --trainer.default_root_dir)",
    errno.EROFS: "the file system is read-only: write the run somewhere writable (e.g. --trainer.default_root_dir)",
    errno.EACCES: "no permission to write there: choose a directory you can write (e.g. --trainer.default_root_dir)",
    errno.EPERM: "no permission to write there: choose a directory you can write (e.g. --trainer.default_root_dir)",
    errno.ENOSPC: "the disk is full: free space or write the run to another disk; the last complete checkpoint is kept",
}


# Where each command takes the directory it writes to (the fix an OS error's line suggests).
_OUTPUT_OPTION = {"sweep": "the sweep file's root:", "lacuna": "--workdir", "evaluate": "another run directory"}


def _environment_error(err: BaseException, command: str = "fit") -> str | None:
    """One line for an OS error on a path the user chose (:data:`_ENVIRONMENT_ERRORS`), else None; the fix names
    ``command``'s own option for the directory (``fit``: ``--trainer.default_root_dir``)."""
    if not isinstance(err, OSError) or err.errno not in _ENVIRONMENT_ERRORS:
        return None
    fix = _ENVIRONMENT_ERRORS[err.errno].replace(
        "--trainer.default_root_dir", _OUTPUT_OPTION.get(command, "--trainer.default_root_dir")
    )
    return f"{err.strerror}: {str(err.filename)!r}; {fix}"


def _same_weights(fingerprint: str | None, model_path) -> bool:
    """Whether the weights at ``model_path`` have the fingerprint a checkpoint recorded for its starting model."""
    from lightning_unlearn.models import weights_fingerprint

    if not fingerprint or not model_path or not Path(str(model_path)).is_dir():
        return False
    try:
        return weights_fingerprint(model_path) == fingerprint
    except Exception:  # noqa: BLE001 - unreadable weights are not the same weights
        return False


def _plain(value):
    """A parsed config value as plain Python (jsonargparse Namespaces and dataclasses to dicts)."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def command_help() -> str:
    """The non-Trainer commands, their subcommands and the aliases, one line each with its description."""
    lines = ["", "Other commands (lightning-unlearn COMMAND --help):"]
    for name, (_, description) in EXTRA_COMMANDS.items():
        lines.append(f"  {name:<22} {description}")
        for sub, sub_description in SUBCOMMANDS.get(name, {}).items():
            lines.append(f"    {sub:<20} {sub_description}")
    lines += ["", "Aliases (the old spellings, kept for one release; they also accept --dashed-flags):"]
    for alias, words in ALIASES.items():
        lines.append(f"  {alias:<22} alias of {' '.join(words)}")
    return "\n".join(lines)


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


_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|nan)$", re.IGNORECASE)


def _joined_negative_values(argv: list[str]) -> list[str]:
    """``--key -1e-3`` → ``--key=-1e-3``: argparse reads a word that starts with ``-`` and is not a plain negative
    number (``-1e-3``, ``-inf``) as an option, and would report ``--key: expected one argument``."""
    out: list[str] = []
    for word in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NUMBER.match(word):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def _check_yaml_files(argv: list[str], prog: str = "lightning-unlearn") -> None:
    """Every ``-c FILE`` is UTF-8 and valid YAML, a mapping, with no key given twice in it, or one line naming the file,
    line and column (jsonargparse would name ``"<unicode string>"``, and YAML would keep the last of two equal keys
    silently)."""
    from lightning_unlearn.configs.yaml_files import read_yaml

    paths = [argv[i + 1] for i, w in enumerate(argv[:-1]) if w in ("-c", "--config")]
    paths += [w.split("=", 1)[1] for w in argv if w.startswith("--config=")]
    for path in paths:
        if not Path(path).is_file():
            continue  # jsonargparse names a missing file itself
        try:
            data = read_yaml(path)
        except ValueError as err:
            raise SystemExit(f"{prog}: error: {err}") from None
        if data is not None and not isinstance(data, dict):
            raise SystemExit(
                f"{prog}: error: {path} holds a YAML {type(data).__name__}; a config is a mapping of keys (trainer:, "
                "model:, data: …), one per line as `key: value`."
            )


def underscore_flags(argv: list[str]) -> list[str]:
    """Old dashed flags in jsonargparse's spelling: ``--max-new-tokens=60`` → ``--max_new_tokens=60``, and the
    :data:`RENAMED_FLAGS` (``--no-control`` → ``--control false``).

    Only option names change (a word starting with ``--``, up to any ``=``); values and ``--`` stay as they are.
    """
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, sep, value = arg[2:].partition("=")
            arg = "--" + name.replace("-", "_") + sep + value
        out += RENAMED_FLAGS.get(arg, (arg,))
    return out


def run_extra_command(argv: list[str]) -> None:
    """Run the non-Trainer command (or alias) named by ``argv[0]`` with the rest of ``argv``.

    ``-c`` is short for ``--config``. A :data:`USER_ERRORS` exception ends the command with
    ``lightning-unlearn <command>: error: <message>`` (one line, exit code 1).
    """
    name, args = argv[0], argv[1:]
    if name in ALIASES:
        words = ALIASES[name]
        name, args = words[0], [*words[1:], *underscore_flags(args)]
    args = ["--config" if arg == "-c" else arg for arg in args]
    shown = name
    if args and args[0] in SUBCOMMANDS.get(name, {}):
        shown = f"{name} {args[0]}"
    _check_yaml_files(args, f"lightning-unlearn {shown}")
    module, func = EXTRA_COMMANDS[name][0].split(":")
    try:
        getattr(importlib.import_module(module), func)(args)
    except USER_ERRORS as err:
        message = " ".join(str(err).splitlines())
        raise SystemExit(f"lightning-unlearn {shown}: error: {message}") from None
    except OSError as err:  # the output directory: not a directory, read-only, full
        if _environment_error(err, name) is None:
            raise
        raise SystemExit(f"lightning-unlearn {shown}: error: {_environment_error(err, name)}") from None


def main(argv: list[str] | None = None) -> None:
    """The ``lightning-unlearn`` console script: a non-Trainer command, or ``fit`` / ``validate`` through LightningCLI.

    Sets the Hugging Face libraries offline, logs INFO through ``lightning_unlearn``, resolves shipped config
    names and checks the YAML files before LightningCLI parses them.

    Args:
        argv: the command line without the program name; ``None`` reads ``sys.argv`` (running as a program).
    """
    if argv is None:
        # Run as a program (the console script, `python -m`, a rank Lightning's launcher started): the process ends
        # with the command, so its last garbage collection need not walk the import graph of torch, Lightning and
        # transformers (1-2 s of CPU per process here); gc.freeze at exit leaves those objects out of it.
        atexit.register(gc.freeze)
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    # The package logs progress and decisions under the `lightning_unlearn` logger; the commands show INFO.
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_third_party()
    if argv and (argv[0] in EXTRA_COMMANDS or argv[0] in ALIASES):
        run_extra_command(argv)
        return
    argv = _joined_negative_values(_resolve_config_args(argv))
    _check_yaml_files(argv)
    # As the command line itself (Lightning's DDP launcher re-runs sys.argv in each child process): the resolved
    # config paths and joined values, without LightningCLI's warning about `args` given beside a command line.
    saved_argv, sys.argv = sys.argv, [sys.argv[0], *argv]
    try:
        UnlearnCLI(args=None)
    finally:
        sys.argv = saved_argv
        if argv in ([], ["-h"], ["--help"]):
            print(command_help())


if __name__ == "__main__":
    main()
