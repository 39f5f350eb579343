"""The stop rule of unlearning runs: end ``fit`` when a step's weights are bad, and keep nothing of that step."""

from __future__ import annotations

import logging
import math

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_unlearn.callbacks.stop_aware_checkpoint import StopAwareCheckpoint
from lightning_unlearn.callbacks.stop_listener import StopListener
from lightning_unlearn.errors import ConfigError

log = logging.getLogger("lightning_unlearn")


class StopRule(Callback):
    """End ``fit`` when the loss of a training step shows that the update before it made bad weights.

    The rule fires on the weights of step k when, on any rank, the loss is not finite, the mean forget NLL̄ (nats per
    answer token) exceeds ``max_bad_loss`` (Yao et al.), or the mean retain NLL̄ reaches ``collapse_fraction`` of
    ln |V|, the NLL̄ of a uniform output (a collapse with a finite loss). Every rank then agrees
    (``trainer.strategy.reduce_boolean_decision``, as ``EarlyStopping`` decides), sets ``trainer.should_stop``, and
    every :class:`StopListener` in ``trainer.callbacks`` discards what it keeps of step k or later: a
    :class:`StopAwareCheckpoint` its checkpoints and adapter directories (``last`` = the newest good checkpoint), the
    evaluators their rows, ``CheckpointSelection`` records the stop. The module skips the update of step k (it
    back-propagates an exact zero, so DDP/FSDP stay in lockstep).

    :class:`~lightning_unlearn.objectives.UnlearningModule` builds it from its own ``max_bad_loss`` and
    ``collapse_fraction`` and attaches it through ``configure_callbacks``; its ``training_step`` calls :meth:`check`
    after the loss and before the backward, the one point where a skipped update can still back-propagate zero.

    At ``setup`` of ``fit`` every plain ``ModelCheckpoint`` of the trainer becomes a :class:`StopAwareCheckpoint`
    (:meth:`StopAwareCheckpoint.adopt`); another checkpoint callback that is no :class:`StopListener` is warned about.

    Args:
        max_bad_loss: stop when the mean forget NLL̄ exceeds this; ``None`` disables the bound. A non-finite loss
            always stops the run.
        collapse_fraction: stop when the mean retain NLL̄ reaches this fraction of ln |V| (0.9: the model has
            collapsed); ``None`` disables it.

    Raises:
        ValueError: ``collapse_fraction`` outside (0, 1] or a ``max_bad_loss`` that is not positive.

    Example::

        >>> from lightning_unlearn.callbacks import StopRule
        >>> StopRule(max_bad_loss=5.0).broken_rule(loss=7.2, forget_nll=7.2)  # this step's weights are bad
        'the forget NLL 7.2 exceeds max_bad_loss=5'
    """

    def __init__(self, max_bad_loss: float | None = None, collapse_fraction: float | None = None) -> None:
        if collapse_fraction is not None and not 0 < collapse_fraction <= 1:
            raise ConfigError(f"collapse_fraction={collapse_fraction} must be in (0, 1]: a fraction of ln |V|.")
        if max_bad_loss is not None and not max_bad_loss > 0:
            raise ConfigError(f"max_bad_loss={max_bad_loss} must be positive: it bounds an NLL in nats per token.")
        self.max_bad_loss = max_bad_loss
        self.collapse_fraction = collapse_fraction
        self.reason: str | None = None  # why the last fit stopped
        self.stopped_at_step: int | None = None  # the step whose weights tripped the rule

    @property
    def needs_retain_nll(self) -> bool:
        """Whether :meth:`check` reads the retain NLL̄ (only the collapse bound does)."""
        return self.collapse_fraction is not None

    def broken_rule(
        self, loss: float, forget_nll: float, retain_nll: float | None = None, vocab_size: int | None = None
    ) -> str | None:
        """This rank's verdict on one step: which rule the step breaks, in words, or ``None``."""
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        if self.max_bad_loss is not None and forget_nll > self.max_bad_loss:
            return f"the forget NLL {forget_nll:.4g} exceeds max_bad_loss={self.max_bad_loss:g}"
        if self.collapse_fraction is not None:
            if retain_nll is None or vocab_size is None:
                raise ConfigError("the collapse bound needs the retain NLL and the vocabulary size of the step.")
            uniform = math.log(vocab_size)
            if retain_nll >= self.collapse_fraction * uniform:
                return (
                    f"the retain NLL {retain_nll:.4g} reaches collapse_fraction={self.collapse_fraction:g} of ln |V| = "
                    f"{uniform:.4g} (a uniform output): the model has collapsed"
                )
        return None

    def check(
        self,
        trainer: Trainer,
        loss: float,
        forget_nll: float,
        retain_nll: float | None = None,
        vocab_size: int | None = None,
    ) -> bool:
        """Collective (every rank calls it once per training step, before the backward): whether the run stops here.

        On the first ``True`` of a fit it records the reason and the step, notifies the :class:`StopListener`
        callbacks and logs one warning on rank 0; every ``True`` sets ``trainer.should_stop``.
        """
        reason = self.broken_rule(loss, forget_nll, retain_nll, vocab_size)
        # Every rank must agree, or one rank would skip its update while the others wait in a collective.
        if not trainer.strategy.reduce_boolean_decision(reason is not None, all=False):
            return False
        if self.stopped_at_step is None:
            self._stop(trainer, reason or "another rank's stop rule fired")
        trainer.should_stop = True
        return True

    # -- hooks ------------------------------------------------------------------------------------------------
    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """At ``fit``: forget an earlier stop, adopt each plain ``ModelCheckpoint`` as a :class:`StopAwareCheckpoint`.

        Any other checkpoint callback that is no :class:`StopListener` gets a warning on rank 0.

        Args:
            trainer: the trainer whose ``checkpoint_callbacks`` are adopted.
            pl_module: the module trained.
            stage: the trainer's stage; only ``fit`` does anything.
        """
        if stage != "fit":
            return
        self.reason, self.stopped_at_step = None, None
        for callback in trainer.checkpoint_callbacks:
            if type(callback) is ModelCheckpoint:
                StopAwareCheckpoint.adopt(callback)
            elif not isinstance(callback, StopListener):
                rank_zero_warn(
                    f"{type(callback).__name__} is no StopListener: if the stop rule fires, the checkpoints it saved "
                    "of the bad step stay, and it may save that step's weights again. Derive it from "
                    "lightning_unlearn.callbacks.StopAwareCheckpoint."
                )

    def _stop(self, trainer: Trainer, reason: str) -> None:
        bad_step = int(trainer.global_step)
        self.reason, self.stopped_at_step = reason, bad_step
        pl_module = trainer.lightning_module
        for callback in trainer.callbacks:
            if isinstance(callback, StopListener):
                callback.on_run_stopped(trainer, pl_module, bad_step, reason)
        if not trainer.is_global_zero:
            return
        kept = [cb.last_good for cb in trainer.checkpoint_callbacks if isinstance(cb, StopAwareCheckpoint)]
        newest = max((k for k in kept if k is not None), default=None)
        kept_text = f"the last good checkpoint is {newest[1]}" if newest else "no earlier checkpoint was saved"
        log.warning(
            "stopping %s at step %d: %s. The weights of this step and any checkpoint, adapter and evaluation row of "
            "it are discarded; %s.",
            type(pl_module).__name__,
            bad_step,
            reason,
            kept_text,
        )
