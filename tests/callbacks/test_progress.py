"""The progress bar's description: epochs and optimizer steps as a run bounded by either reads them."""

from __future__ import annotations

from types import SimpleNamespace

from lightning_unlearn.callbacks.progress import train_description


def test_a_step_bounded_run_shows_its_steps_not_epoch_minus_two():
    # Lightning sets max_epochs=-1 when max_steps bounds the run; its own bar then reads "Epoch 7/-2".
    trainer = SimpleNamespace(current_epoch=7, global_step=420, max_steps=900, max_epochs=-1)
    assert train_description(trainer) == "Epoch 7 · step 420/900"


def test_an_epoch_bounded_run_shows_its_last_epoch():
    trainer = SimpleNamespace(current_epoch=2, global_step=30, max_steps=-1, max_epochs=10)
    assert train_description(trainer) == "Epoch 2/9"
    assert train_description(SimpleNamespace(current_epoch=0, global_step=0, max_steps=-1, max_epochs=-1)) == "Epoch 0"
