"""Base of the evaluation callbacks: run a metric family at every checkpoint save and in ``validate``.

A subclass names its ``family`` and implements :meth:`CheckpointEvaluator.compute` — a collective that every rank
enters and that returns the same metrics dict on every rank. This class decides when to run, keeps the rows and
the base state in the callback ``state_dict`` (so resumes neither repeat nor lose rows), writes
``<output_dir>/checkpoint_metrics.jsonl`` on rank 0, and sends scalars to every logger.

When it runs:

- ``fit``: in ``on_save_checkpoint``, i.e. exactly when any ``ModelCheckpoint`` saves. Lightning collects
  callback states *before* that hook, so the hook writes this callback's refreshed state into the checkpoint
  being saved — the checkpoint at step k already records that step k was evaluated.
- ``validate``: at the end of the validation epoch, keyed by the loaded checkpoint's ``global_step``.

The module being evaluated exposes ``model`` (a transformers causal LM, possibly peft-wrapped and FSDP-sharded)
and ``tokenizer``; ``reference_logits(batch)`` is used as the base model when it exists.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_unlearn.callbacks.checkpoint_metrics_file import (
    METRICS_FILE,
    flatten_metrics,
    merge_rows,
    run_output_dir,
)
from lightning_unlearn.callbacks.stop_listener import StopListener
from lightning_unlearn.checkpoints import preserved_rng
from lightning_unlearn.distributed import world
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.models import eval_mode


class CheckpointEvaluator(Callback, StopListener):
    """Run one metric family at every checkpoint save and in ``validate``.

    Args:
        name: distinguishes two instances of the same class (part of ``state_key`` and of the row's ``family``).
        output_dir: directory of ``checkpoint_metrics.jsonl``; ``None``: the run's own directory
            (:func:`~lightning_unlearn.callbacks.checkpoint_metrics_file.run_output_dir`).
        batch_size: prompts or sequences per forward / ``generate`` call on each rank.

    Raises:
        ValueError: ``batch_size`` below 1.

    Example::

        >>> from lightning_unlearn.callbacks import CheckpointEvaluator
        >>> class Ones(CheckpointEvaluator):  # a family states its name and its compute
        ...     family = "ones"
        ...     def compute(self, trainer, pl_module, step):
        ...         return {"one": 1.0}
        >>> Ones(name="demo").family_name  # the rows' family: two named instances keep apart
        'ones:demo'
    """

    family: str = ""

    def __init__(self, name: str | None = None, output_dir: str | None = None, batch_size: int = 8) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be at least 1.")
        self.name = name
        self.output_dir = output_dir
        self.batch_size = batch_size
        self.rows: dict[int, dict] = {}  # step -> row, for this family only
        self.base: dict = {}  # base-model quantities computed once (B, base CE, ...)
        self._metrics_path: str | None = None
        self._loaded_step: int | None = None
        self.progress: str | None = None  # while computing: the label of the rank-0 progress bars, None for none
        # validate: key the row by this step rather than the loaded checkpoint's (set by the `evaluate` command for
        # an adapter directory, which carries no step of its own)
        self.step_override: int | None = None
        # outside fit: each step's epoch where a checkpoint does not say it (set by `evaluate` from the run's own
        # training rows, for adapter and merged directories); a row's epoch is None when unknown, never a made-up 0
        self.known_epochs: dict[int, int] = {}
        self._loaded_epoch: int | None = None
        # validate of the starting model itself: it is its own base (set by evaluators that take `current_is_base`)
        self.current_is_base = False

    # -- identity and state -------------------------------------------------------------------------------
    @property
    def metrics_path(self) -> str | None:
        """Where the rows are written (known after ``setup``)."""
        return self._metrics_path

    @property
    def family_name(self) -> str:
        """The ``family`` of this evaluator's rows: ``family``, or ``family:name`` for a named instance."""
        return self.family if self.name is None else f"{self.family}:{self.name}"

    @property
    @override
    def state_key(self) -> str:
        """Key of this callback's state in a checkpoint, built from ``family`` and ``name`` so two instances coexist."""
        return self._generate_state_key(family=self.family, name=self.name)

    @override
    def state_dict(self) -> dict:
        """The evaluated rows (in step order), the base-model quantities and the metrics file's path.

        Returns:
            ``{"rows": [...], "base": {...}, "metrics_path": str | None}``, saved in every checkpoint.
        """
        rows = [self.rows[s] for s in sorted(self.rows)]
        return {"rows": rows, "base": self.base, "metrics_path": self._metrics_path}

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the rows and base quantities of a checkpoint, so a resumed run neither repeats nor loses a step.

        Args:
            state_dict: what :meth:`state_dict` returned; a metrics path set by ``setup`` already is kept.
        """
        self.rows = {int(r["step"]): r for r in state_dict.get("rows", [])}
        self.base = dict(state_dict.get("base", {}))
        self._metrics_path = self._metrics_path or state_dict.get("metrics_path")

    # -- what a subclass implements ---------------------------------------------------------------------
    def compute(self, trainer: Trainer, pl_module: LightningModule, step: int) -> dict:
        """Collective: the family's metrics for the current weights, identical on every rank."""
        raise NotImplementedError

    def compute_base(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        """Collective: base-model quantities kept in ``self.base`` (default: none)."""
        return {}

    def log_extras(self, trainer: Trainer, step: int) -> None:
        """Rank 0, after a row is written: extra logger output (text samples, images)."""

    # -- hooks ----------------------------------------------------------------------------------------------
    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Choose the metrics file (``output_dir`` or the run's directory) and check the module can be evaluated.

        Args:
            trainer: the trainer; its run directory is chosen collectively when ``output_dir`` is ``None``.
            pl_module: the module evaluated; it must expose ``model`` and ``tokenizer``.
            stage: the trainer's stage (``fit``, ``validate``, ...).

        Raises:
            AttributeError: ``pl_module`` lacks ``model`` or ``tokenizer``.
        """
        if self._metrics_path is None:
            root = Path(self.output_dir) if self.output_dir else run_output_dir(trainer)
            self._metrics_path = str(root / METRICS_FILE)
        for attr in ("model", "tokenizer"):
            if not hasattr(pl_module, attr):
                raise AttributeError(
                    f"{type(self).__name__} evaluates `pl_module.{attr}`, which {type(pl_module).__name__} lacks; "
                    "expose the causal LM as `self.model` and its tokenizer as `self.tokenizer`."
                )

    @override
    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        """Remember the loaded checkpoint's step and epoch: a ``validate`` keys its row by them.

        Args:
            trainer: the trainer.
            pl_module: the module the checkpoint is loaded into.
            checkpoint: the loaded checkpoint dict (its ``global_step`` and ``epoch``).
        """
        self._loaded_step = int(checkpoint.get("global_step", 0))
        self._loaded_epoch = int(checkpoint["epoch"]) if checkpoint.get("epoch") is not None else None

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Collective: compute the base-model quantities before the first update (:meth:`ensure_base`).

        Args:
            trainer: the trainer.
            pl_module: the module about to be trained.
        """
        self.ensure_base(trainer, pl_module)

    @override
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        """Collective, in ``fit``: evaluate the step being saved (once) and write this state into that checkpoint.

        Sanity checking and other stages do nothing here.

        Args:
            trainer: the trainer; its ``global_step`` is the row's step.
            pl_module: the module evaluated.
            checkpoint: the checkpoint dict being saved; its ``callbacks[state_key]`` is replaced.
        """
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        step = int(trainer.global_step)
        if step not in self.rows:
            self._evaluate(trainer, pl_module, step)
        # Lightning gathered callback states before this hook: record this step in the checkpoint being saved.
        checkpoint.setdefault("callbacks", {})[self.state_key] = self.state_dict()

    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Collective, in ``validate``: evaluate the loaded weights as one row.

        The row's step is ``step_override``, else the loaded checkpoint's ``global_step``, else the trainer's.

        Args:
            trainer: the trainer.
            pl_module: the module evaluated.
        """
        if trainer.sanity_checking or trainer.state.fn != "validate":
            return
        self.ensure_base(trainer, pl_module)
        step = self.step_override
        if step is None:
            step = self._loaded_step if self._loaded_step is not None else int(trainer.global_step)
        self._evaluate(trainer, pl_module, step)

    @override
    def on_run_stopped(self, trainer: Trainer, pl_module: LightningModule, bad_step: int, reason: str) -> None:
        """The weights of ``bad_step`` and later were never good: their rows go, from the state and from the metrics
        file."""
        self.rows = {s: r for s, r in self.rows.items() if s < bad_step}
        if world()[0] == 0 and self._metrics_path is not None and Path(self._metrics_path).exists():
            merge_rows(self._metrics_path, [], drop_from=bad_step)
            self.discard_extras(bad_step)

    def discard_extras(self, bad_step: int) -> None:
        """Rank 0, after a stop: remove what :meth:`log_extras` wrote for steps ≥ ``bad_step`` (default: nothing)."""

    # -- machinery ------------------------------------------------------------------------------------------
    def ensure_base(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Collective: compute the base-model quantities once (kept in ``self.base``, saved in checkpoints); a no-op
        when they are already there (from a checkpoint, or set by the ``evaluate`` command)."""
        if self.base:
            return
        with preserved_rng(), eval_mode(pl_module.model):
            self.base = self.compute_base(trainer, pl_module)

    def _evaluate(self, trainer: Trainer, pl_module: LightningModule, step: int) -> None:
        self.evaluate_pass(trainer, pl_module, [step], lambda: {step: self.compute(trainer, pl_module, step)})

    def evaluate_pass(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        steps: Sequence[int],
        compute: Callable[[], Mapping[int, dict]],
    ) -> None:
        """Collective: the rows of ``steps`` from one pass, ``compute() -> {step: metrics}``, run in eval mode with
        the RNG state preserved and recorded in ``steps`` order, each step's ``seconds`` an even share of the pass.

        Every checkpoint evaluation goes through here: one step's :meth:`compute` at a save or in ``validate``, and
        several adapter checkpoints answered together in post-hoc evaluation.
        """
        if not steps:
            raise ConfigError(f"{self.family_name}: an evaluation pass needs at least one step.")
        start = time.perf_counter()
        where = f"step {steps[0]}" if len(steps) == 1 else f"steps {', '.join(str(s) for s in steps)}"
        # The trainer's progress bar setting decides (enable_progress_bar: false turns these off too).
        self.progress = f"{self.family_name} @ {where}" if trainer.progress_bar_callback is not None else None
        with preserved_rng(), eval_mode(pl_module.model):
            metrics = compute()
        self.progress = None
        seconds = (time.perf_counter() - start) / len(steps)
        for step in steps:
            self.record(trainer, step, metrics[step], seconds)

    def record(self, trainer: Trainer, step: int, metrics: dict, seconds: float) -> None:
        """Keep ``metrics`` as step ``step``'s row; on rank 0 write it, log it and notify the other callbacks
        (:meth:`evaluate_pass` calls it once per step of its pass)."""
        if trainer.state.fn == "fit":
            epoch: int | None = int(trainer.current_epoch)
        elif self.step_override is None and self._loaded_epoch is not None:
            epoch = self._loaded_epoch  # the loaded checkpoint's own epoch, not the validate loop's 0
        else:
            epoch = self.known_epochs.get(step)
        row = {
            "step": step,
            "family": self.family_name,
            "epoch": epoch,
            "fn": str(trainer.state.fn.value if trainer.state.fn else "validate"),
            "seconds": round(seconds, 4),
            **metrics,
        }
        self.rows[step] = row
        if world()[0] != 0:
            return
        # fit: every row in the state (all steps this run evaluated, including before a resume) joins the file's,
        # so a resume into a fresh log directory still yields the whole history. validate: only this row.
        fitting = trainer.state.fn == "fit"
        merge_rows(self._metrics_path, [self.rows[s] for s in sorted(self.rows)] if fitting else [row])
        scalars = {f"{self.family_name}/{k}": v for k, v in flatten_metrics(metrics).items()}
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=step)
        self.log_extras(trainer, step)
        for cb in trainer.callbacks:
            notify = getattr(cb, "on_checkpoint_evaluated", None)
            if callable(notify):
                notify(trainer, row)

    def base_context(self, pl_module: LightningModule, trainer: Trainer):
        """A context in which ``pl_module.model`` is the base model: the adapter disabled, step 0 of ``fit``, or —
        when the evaluator was told so (``current_is_base``) — a ``validate`` of the configured model itself (no
        checkpoint loaded, nothing trained)."""
        model = pl_module.model
        if hasattr(model, "disable_adapter"):
            return model.disable_adapter()
        if trainer.state.fn == "fit" and trainer.global_step == 0:
            return contextlib.nullcontext()
        untouched = trainer.state.fn == "validate" and self._loaded_step is None and trainer.global_step == 0
        if untouched and self.current_is_base:
            return contextlib.nullcontext()
        where = f"training is at step {trainer.global_step}" if trainer.state.fn == "fit" else "a checkpoint is loaded"
        raise RuntimeError(
            f"{type(self).__name__} needs base-model outputs, but the model has no adapter to disable and {where}. "
            "Evaluate from step 0 once (its state is saved in the checkpoint) or train a LoRA adapter."
        )
