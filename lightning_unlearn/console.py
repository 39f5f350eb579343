"""What the package's commands print: their own progress, decisions and results, not third-party noise.

:func:`quiet_third_party` runs first in every entry point (``lightning-unlearn`` and its stage subprocesses, whose
DDP children re-run the same entry point). It hides a fixed list of messages that say nothing about the run, each
matched by its text so any other warning, and every warning of this package, still shows:

- Lightning's tips advertising its cloud products (``💡 Tip: …``), logged at INFO on every ``fit``;
- the deprecation notice Lightning's own ``_pytree`` helper triggers inside torch (not the user's code);
- "You defined a ``validation_step`` but have no ``val_dataloader``": every objective can validate, and a run whose
  data has no validation split is normal here;
- transformers' notice that ``is_gradient_checkpointing`` is deprecated, which peft triggers when it wraps a model;
- the hint to add DataLoader workers: the loaders of this package read tokenized rows already in memory;
- transformers' per-file progress bars ("Loading weights", "Writing model shards"), which redraw on every model
  load and save of a stage;
- Lightning's "GPU available: False, used: False" and "TPU available: False, …" on a machine without them, printed
  by every stage (an accelerator that is there is still announced).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

NOISE = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"You defined a `validation_step` but have no `val_dataloader`",
    r".*does not have many workers",
    r"`is_gradient_checkpointing` is deprecated",
)
TIP_PREFIX = "💡 Tip"
NO_ACCELERATOR = re.compile(r"(GPU available: False, used: False|TPU available: False, using: 0 TPU cores)$")
# What a quiet run of this package never prints, whatever the cause (its tests check each command's output with it): a
# Python warning (its "file.py:LINE: SomethingWarning:" line or the `warnings.warn(` source line under it), a
# traceback, Lightning's product tips, an epoch shown as "Epoch 7/-2".
UNWANTED_OUTPUT = re.compile(r"Warning:|warnings\.warn\(|Traceback|💡|Epoch \d+/-\d")
LIGHTNING_INFO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _DropTips(logging.Filter):
    """Drops Lightning's product tips and its notices of absent accelerators; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not (message.startswith(TIP_PREFIX) or NO_ACCELERATOR.match(message))


def quiet_third_party() -> None:
    """Hide the messages listed in this module's docstring (idempotent)."""
    for pattern in NOISE:
        warnings.filterwarnings("ignore", message=pattern)
    for name in LIGHTNING_INFO_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTips) for f in logger.filters):
            logger.addFilter(_DropTips())
    # transformers reads this when it is first imported (a user who sets it keeps their value); the stage
    # subprocesses inherit it.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
