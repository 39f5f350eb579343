"""The stop rule as a callback: its verdicts, and what a stop leaves of a run's checkpoints (any LightningModule)."""

import math

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_unlearn.callbacks import StopAwareCheckpoint, StopRule


def test_each_rule_names_what_it_saw():
    rule = StopRule(max_bad_loss=2.0, collapse_fraction=0.9)
    assert rule.broken_rule(float("nan"), 1.0, 1.0, 300) == "the loss is nan"
    assert rule.broken_rule(1.0, 2.5, 1.0, 300) == "the forget NLL 2.5 exceeds max_bad_loss=2"
    # 0.9 · ln 300 = 5.1334: a retain NLL of 5.2 is a collapse, 5.1 is not
    assert "collapse_fraction=0.9 of ln |V| = 5.704" in rule.broken_rule(1.0, 1.0, 5.2, 300)
    assert rule.broken_rule(1.0, 1.0, 5.1, 300) is None and 0.9 * math.log(300) == pytest.approx(5.1334, abs=1e-4)
    assert StopRule().broken_rule(1e6, 1e6) is None  # no bounds: only a non-finite loss stops
    with pytest.raises(ValueError, match="collapse_fraction"):
        StopRule(collapse_fraction=1.5)
    with pytest.raises(ValueError, match="max_bad_loss"):
        StopRule(max_bad_loss=0.0)


class _BadAtStep3(BoringModel):
    """Any LightningModule can use the rule: this one's loss is infinite on the weights of step 3."""

    def __init__(self) -> None:
        super().__init__()
        self.stop_rule = StopRule()

    def configure_callbacks(self):
        return [self.stop_rule]

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)["loss"]
        # the monitored metric, the step of the checkpoint saved after this update: newer is better
        self.log("score", float(self.global_step + 1))
        seen = float("inf") if self.global_step == 3 else float(loss.detach())
        if self.stop_rule.check(self.trainer, seen, forget_nll=0.0):
            return loss * 0.0
        return loss


def _fit(tmp_path, checkpoint):
    trainer = Trainer(
        default_root_dir=tmp_path, max_steps=8, callbacks=[checkpoint], logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(_BadAtStep3())
    return trainer


def test_a_stop_keeps_the_top_k_and_last_consistent_with_the_files(tmp_path):
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path, filename="{step}", monitor="score", mode="max", save_top_k=2, save_last=True,
        every_n_train_steps=1,
    )  # fmt: skip
    key = checkpoint.state_key
    trainer = _fit(tmp_path, checkpoint)
    # the object the user made is the one that ran, now stop-aware, with the key its checkpoints are saved under
    assert isinstance(checkpoint, StopAwareCheckpoint) and trainer.checkpoint_callback is checkpoint
    assert checkpoint.state_key == key and checkpoint.stopped_at_step == 3
    # step 3 (saved before its loss was seen) is gone, nothing of the skipped step 4 was written, and the top 2 are
    # now step 2 alone; last.ckpt holds step 2's weights
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["last.ckpt", "step=2.ckpt"]
    step2 = str(tmp_path / "step=2.ckpt")
    assert list(checkpoint.best_k_models) == [step2] and checkpoint.best_model_path == step2
    assert checkpoint.kth_best_model_path == step2 and float(checkpoint.best_model_score) == 2.0
    assert checkpoint.last_model_path == str(tmp_path / "last.ckpt")
    last, good = (torch.load(tmp_path / n, weights_only=True) for n in ("last.ckpt", "step=2.ckpt"))
    assert last["global_step"] == 2 and all(
        torch.equal(v, good["state_dict"][k]) for k, v in last["state_dict"].items()
    )
    assert trainer.global_step == 4 and trainer.lightning_module.stop_rule.reason == "the loss is inf"


def test_without_a_good_checkpoint_nothing_is_left_and_nothing_is_named(tmp_path):
    checkpoint = StopAwareCheckpoint(dirpath=tmp_path, filename="{step}", save_last=True, every_n_train_steps=3)
    _fit(tmp_path, checkpoint)
    assert not list(tmp_path.glob("*.ckpt"))  # step 3 was the only one, and last was its copy
    assert checkpoint.best_model_path == "" and checkpoint.last_model_path == "" and checkpoint.last_good is None


def test_a_checkpoint_callback_that_cannot_discard_is_warned_about(tmp_path):
    class OwnCheckpoint(ModelCheckpoint):
        pass

    with pytest.warns(UserWarning, match="OwnCheckpoint is no StopListener"):
        _fit(tmp_path, OwnCheckpoint(dirpath=tmp_path, every_n_train_steps=1))
    with pytest.raises(TypeError, match="derive that class from StopAwareCheckpoint"):
        StopAwareCheckpoint.adopt(OwnCheckpoint())
