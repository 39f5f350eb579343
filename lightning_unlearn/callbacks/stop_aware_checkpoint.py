"""A ``ModelCheckpoint`` that owns what the stop rule discards: the bad steps' files and its own bookkeeping."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from lightning_unlearn.atomic import write_directory_atomically, write_file_atomically
from lightning_unlearn.callbacks.stop_listener import StopListener
from lightning_unlearn.checkpoints import checkpoint_step

# Directories the objectives write beside each checkpoint, named by its step (UnlearningModule.adapter_dir).
STEP_DIRECTORY_PREFIXES = ("adapter-step=", "merged-step=")


class StopAwareCheckpoint(ModelCheckpoint, StopListener):
    """``ModelCheckpoint`` (same arguments) that, when the stop rule fires at step k, keeps nothing of step k or later.

    On :meth:`on_run_stopped` it removes, through ``trainer.strategy.remove_checkpoint``, every checkpoint in its
    ``dirpath`` (single files and sharded directories) whose ``global_step`` is k or more, and rank 0 removes the
    ``adapter-step=N`` / ``merged-step=N`` directories beside them with N ≥ k. Each ``last`` checkpoint becomes a copy
    of the newest good checkpoint (written atomically), or goes when there is none. ``best_k_models``,
    ``best_model_path``, ``kth_best_model_path`` and ``last_model_path`` then name only files that exist. For the rest
    of that ``fit`` it saves nothing: the weights are still step k's (Lightning counts the skipped update as a step, so
    step k + 1 would otherwise be saved with them).

    Its ``state_key`` is ``ModelCheckpoint``'s, so the two read each other's checkpoints.
    :class:`~lightning_unlearn.callbacks.StopRule` turns a plain ``ModelCheckpoint`` of the trainer into this class at
    ``setup`` (:meth:`adopt`).

    Example::

        >>> from lightning.pytorch.callbacks import ModelCheckpoint
        >>> from lightning_unlearn.callbacks import StopAwareCheckpoint
        >>> checkpoint = StopAwareCheckpoint.adopt(ModelCheckpoint(every_n_train_steps=10))
        >>> type(checkpoint).__name__, isinstance(checkpoint, ModelCheckpoint)  # the same object, now stop-aware
        ('StopAwareCheckpoint', True)
    """

    # Class defaults, so that an adopted ModelCheckpoint has them too.
    stopped_at_step: int | None = None  # the first discarded step of this fit, None while it runs on
    last_good: tuple[int, str] | None = None  # after a stop: (step, path) of the newest checkpoint kept

    @classmethod
    def adopt(cls, checkpoint: ModelCheckpoint) -> StopAwareCheckpoint:
        """Make a plain ``ModelCheckpoint`` this class in place: the same object, configuration and state (the caller's
        reference stays valid), with this class's hooks. A subclass of ``ModelCheckpoint`` is refused: its own
        overrides would be lost.

        Raises:
            TypeError: ``checkpoint`` is a subclass of ``ModelCheckpoint``, not a plain one.
        """
        if type(checkpoint) is not ModelCheckpoint:
            raise TypeError(
                f"StopAwareCheckpoint.adopt takes a plain ModelCheckpoint, not {type(checkpoint).__name__}; derive "
                "that class from StopAwareCheckpoint instead."
            )
        checkpoint.__class__ = cls
        return checkpoint  # type: ignore[return-value]

    @property
    @override
    def state_key(self) -> str:
        """``ModelCheckpoint``'s state key, so a plain ``ModelCheckpoint`` and this class read each other's state."""
        key = super().state_key
        return ModelCheckpoint.__qualname__ + key.removeprefix(type(self).__qualname__)

    # -- saving, unless the run was stopped ---------------------------------------------------------------------
    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Set up as ``ModelCheckpoint`` does; a new ``fit`` forgets any earlier stop.

        Args:
            trainer: the trainer.
            pl_module: the module trained.
            stage: the trainer's stage.
        """
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            self.stopped_at_step, self.last_good = None, None

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any) -> None:
        """Save as ``ModelCheckpoint`` does, unless the run was stopped (the weights are still the bad step's).

        Args:
            trainer: the trainer.
            pl_module: the module trained.
            *args: ``ModelCheckpoint.on_train_batch_end``'s remaining arguments.
            **kwargs: ``ModelCheckpoint.on_train_batch_end``'s keyword arguments.
        """
        if self.stopped_at_step is None:
            super().on_train_batch_end(trainer, pl_module, *args, **kwargs)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Save as ``ModelCheckpoint`` does at an epoch's end, unless the run was stopped.

        Args:
            trainer: the trainer.
            pl_module: the module trained.
        """
        if self.stopped_at_step is None:
            super().on_train_epoch_end(trainer, pl_module)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Save as ``ModelCheckpoint`` does after validation, unless the run was stopped.

        Args:
            trainer: the trainer.
            pl_module: the module trained.
        """
        if self.stopped_at_step is None:
            super().on_validation_end(trainer, pl_module)

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """Save as ``ModelCheckpoint`` does on an exception (``save_on_exception``), unless the run was stopped.

        Args:
            trainer: the trainer.
            pl_module: the module trained.
            exception: the exception that ended training.
        """
        if self.stopped_at_step is None:
            super().on_exception(trainer, pl_module, exception)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Save as ``ModelCheckpoint`` does at the end of training, unless the run was stopped.

        Args:
            trainer: the trainer.
            pl_module: the module trained.
        """
        if self.stopped_at_step is None:
            super().on_train_end(trainer, pl_module)

    # -- the stop ---------------------------------------------------------------------------------------------
    @override
    def on_run_stopped(self, trainer: Trainer, pl_module: LightningModule, bad_step: int, reason: str) -> None:
        """Collective: remove the checkpoints and step directories of ``bad_step`` and later, repoint ``last``.

        Rank 0 plans the removal from ``dirpath`` and broadcasts it; every rank removes through the strategy, so
        sharded checkpoints go too. Each stale ``last`` becomes a copy of the newest good checkpoint, or goes.

        Args:
            trainer: the trainer.
            pl_module: the module trained.
            bad_step: the first step whose weights are discarded.
            reason: which rule fired (unused here).
        """
        self.stopped_at_step = bad_step
        # Rank 0 reads the directory; every rank then takes the same decisions, so the bookkeeping stays identical.
        plan: DiscardPlan = trainer.strategy.broadcast(self._discard_plan(bad_step) if trainer.is_global_zero else None)
        for path in plan.doomed:
            trainer.strategy.remove_checkpoint(path)
        for last in plan.stale_lasts:
            if plan.last_good is None:
                trainer.strategy.remove_checkpoint(last)
            elif trainer.is_global_zero:
                _copy_atomically(plan.last_good[1], last)
        if trainer.is_global_zero:
            for directory in plan.step_dirs:
                shutil.rmtree(directory, ignore_errors=True)
        self.last_good = plan.last_good
        self._forget(plan)

    def _discard_plan(self, bad_step: int) -> DiscardPlan:
        """Rank 0: what goes, read from the files in ``dirpath`` (a resumed run's earlier files included)."""
        root = Path(self.dirpath) if self.dirpath else None
        if root is None or not root.is_dir():
            return DiscardPlan([], [], [], None, None)
        doomed, good, lasts = [], [], []
        for path in sorted(root.glob(f"*{self.FILE_EXTENSION}")):
            step = checkpoint_step(path)
            if path.name.startswith(self.CHECKPOINT_NAME_LAST):
                lasts.append((step, str(path)))
            elif step is not None and step >= bad_step:
                doomed.append(str(path))
            elif step is not None:
                good.append((step, str(path)))
        step_dirs = [
            str(d)
            for d in sorted(root.iterdir())
            if d.is_dir() and any(_step_of(d.name, prefix) >= bad_step for prefix in STEP_DIRECTORY_PREFIXES)
        ]
        newest = last_good = max(good, default=None)
        for step, path in lasts:
            if step is not None and step < bad_step and (last_good is None or step > last_good[0]):
                last_good = (step, path)  # a last checkpoint that already holds the newest good weights
        stale = [path for step, path in lasts if last_good is None or step != last_good[0]]
        return DiscardPlan(doomed, step_dirs, stale, newest, last_good)

    def _forget(self, plan: DiscardPlan) -> None:
        """Drop the removed files from the bookkeeping, so that every path it names exists."""
        gone = {os.path.normpath(p) for p in plan.doomed}
        if plan.last_good is None:
            gone |= {os.path.normpath(p) for p in plan.stale_lasts}
        for path in [p for p in self.best_k_models if os.path.normpath(p) in gone]:
            del self.best_k_models[path]
        if self.best_k_models:  # a monitored metric ranks what is left
            better, worse = (min, max) if self.mode == "min" else (max, min)
            self.best_model_path = better(self.best_k_models, key=self.best_k_models.get)
            self.best_model_score = self.best_k_models[self.best_model_path]
            self.kth_best_model_path = worse(self.best_k_models, key=self.best_k_models.get)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        elif self.best_model_path and os.path.normpath(self.best_model_path) in gone:
            # no monitor: the "best" checkpoint is the newest one
            self.best_model_path = plan.newest[1] if plan.newest else ""
            self.best_model_score = None
        if self.kth_best_model_path and os.path.normpath(self.kth_best_model_path) in gone:
            self.kth_best_model_path = ""
        if self.last_model_path and os.path.normpath(self.last_model_path) in gone:
            self.last_model_path = ""


class DiscardPlan(NamedTuple):
    """What a stop at ``bad_step`` removes from one checkpoint directory (paths as strings)."""

    doomed: list[str]  # checkpoints of steps ≥ bad_step
    step_dirs: list[str]  # adapter-step=N / merged-step=N directories with N ≥ bad_step
    stale_lasts: list[str]  # last checkpoints that do not hold the newest good weights
    newest: tuple[int, str] | None  # (step, path) of the newest good step checkpoint
    last_good: tuple[int, str] | None  # (step, path) of the newest good weights, a last checkpoint included


def _step_of(name: str, prefix: str) -> int:
    digits = name.removeprefix(prefix) if name.startswith(prefix) else ""
    return int(digits) if digits.isdigit() else -1


def _copy_atomically(source: str, target: str) -> None:
    """``target`` becomes a copy of ``source`` (a file, or a sharded checkpoint directory), never half-written."""
    if os.path.islink(target):
        os.remove(target)  # a save_last="link" link to a removed checkpoint: replace the link, not its target
    if Path(source).is_dir():
        write_directory_atomically(target, lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True))
    else:
        write_file_atomically(target, lambda tmp: shutil.copyfile(source, tmp))
