"""A callback that SIGKILLs its own process at a chosen moment of a real run (imported by the fit subprocesses of
``test_kill_and_resume.py`` through ``PYTHONPATH``): every rank kills itself at the same moment, as a node failure
would end them."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from lightning.pytorch import Callback


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillAt(Callback):
    """``moment``: ``step`` (after the optimizer step of ``step``, with no checkpoint of it: mid-epoch),
    ``write`` (halfway through writing the checkpoint file of ``step``: a truncated file is left behind) or
    ``evaluation`` (inside the checkpoint save of ``step``, after the evaluators listed before this callback
    wrote their rows and before the ones after it ran)."""

    def __init__(self, moment: str, step: int) -> None:
        if moment not in ("step", "write", "evaluation"):
            raise ValueError(f"unknown moment {moment!r}")
        self.moment, self.step = moment, step

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.moment != "write":
            return
        io = trainer.strategy.checkpoint_io
        save = io.save_checkpoint

        def save_then_die(checkpoint, path, storage_options=None):
            if int(checkpoint.get("global_step", -1)) != self.step:
                return save(checkpoint, path, storage_options)
            save(checkpoint, path, storage_options)
            data = Path(path).read_bytes()
            Path(path).write_bytes(data[: len(data) // 2])  # the bytes a kill mid-write leaves
            _die()

        io.save_checkpoint = save_then_die

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.moment == "step" and trainer.global_step == self.step:
            _die()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if self.moment == "evaluation" and trainer.global_step == self.step:
            _die()
