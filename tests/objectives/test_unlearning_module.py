"""The shared machinery: stop rules, checkpoints with adapter directories, optimizer schedule, errors."""

import pytest
import torch
from conftest import fit
from lightning.pytorch.callbacks import ModelCheckpoint
from peft import PeftModel

from lightning_unlearn.models import AdapterConfig, load_causal_lm
from lightning_unlearn.objectives import GradientAscent, OptimizerConfig


def test_max_bad_loss_stops_once_and_skips_the_bad_update(testbed, tmp_path, capsys):
    module = GradientAscent(testbed.model_dir, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-2), max_bad_loss=2.0)
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    trainer = fit(module, testbed, callbacks=[ckpt], enable_checkpointing=True)
    assert "max_bad_loss" in module.stop_reason
    assert trainer.global_step < 20
    assert capsys.readouterr().out.count("stopping GradientAscent") == 1
    # The last two checkpoints hold the same weights: the step that crossed the bound changed nothing.
    paths = sorted(tmp_path.glob("*.ckpt"), key=lambda p: int(p.stem.split("step=")[1]))
    last, before_last = (torch.load(p, weights_only=True)["state_dict"] for p in paths[-1:-3:-1])
    assert all(torch.equal(last[k], before_last[k]) for k in last)


def test_non_finite_loss_stops_the_run(testbed):
    class Exploding(GradientAscent):
        def unlearning_loss(self, batch):
            loss, logs = super().unlearning_loss(batch)
            return loss * float("inf") if self.global_step == 2 else loss, logs

    module = Exploding(testbed.model_dir, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-4))
    trainer = fit(module, testbed)
    assert module.stop_reason.startswith("the loss is") and trainer.global_step == 3
    assert all(torch.isfinite(p).all() for p in module.model.parameters())


def test_lora_checkpoints_write_an_adapter_directory_every_n_steps(testbed, tmp_path):
    module = GradientAscent(testbed.model_dir, AdapterConfig(kind="lora", dropout=0.0), OptimizerConfig(lr=1e-2))
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    fit(module, testbed, max_steps=4, callbacks=[ckpt], enable_checkpointing=True)
    assert sorted(p.name for p in tmp_path.glob("adapter-step=*")) == ["adapter-step=2", "adapter-step=4"]
    reloaded = PeftModel.from_pretrained(load_causal_lm(testbed.model_dir), str(tmp_path / "adapter-step=4"))
    ids = torch.tensor([[1, 5, 9, 13]])
    assert torch.allclose(reloaded(input_ids=ids).logits, module.model(input_ids=ids).logits, atol=1e-5)
    assert not list(tmp_path.glob(".adapter-step=*"))  # no temporary directories left behind


def test_optimizer_schedule():
    cfg = OptimizerConfig(lr=1.0, warmup_steps=2, schedule="linear")
    assert [cfg.lr_factor(s, 6) for s in range(6)] == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
    assert OptimizerConfig(schedule="constant").lr_factor(99, 10) == 1.0
    with pytest.raises(ValueError, match="schedule"):
        OptimizerConfig(schedule="cosine")


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        GradientAscent(str(tmp_path / "nope"))


def test_learning_rate_follows_the_config(testbed):
    module = GradientAscent(testbed.model_dir, AdapterConfig(kind="lora"), OptimizerConfig(lr=3e-4, weight_decay=0.1))
    trainer = fit(module, testbed, max_steps=1)
    group = trainer.optimizers[0].param_groups[0]
    assert group["lr"] == pytest.approx(3e-4) and group["weight_decay"] == 0.1
    assert all("lora_" in n for n, p in module.model.named_parameters() if p.requires_grad)


def test_adalora_trains_and_reallocates_rank(testbed):
    adapter = AdapterConfig(kind="adalora", r=4, dropout=0.0, total_step=6)
    module = GradientAscent(testbed.model_dir, adapter, OptimizerConfig(lr=1e-2))
    trainer = fit(module, testbed, max_steps=6)
    assert trainer.global_step == 6 and module.stop_reason is None
    assert any("lora_E" in n for n, p in module.model.named_parameters() if p.requires_grad)


def test_policy_trains_in_train_mode_and_reference_in_eval_mode(testbed):
    from lightning_unlearn.objectives import NPO

    seen = {}

    class Probe(NPO):
        def training_step(self, batch, batch_idx):
            seen["policy"] = self.model.training
            seen["reference"] = self.reference_model.training
            return super().training_step(batch, batch_idx)

    fit(Probe(testbed.model_dir, AdapterConfig(kind="full")), testbed, max_steps=1)
    assert seen == {"policy": True, "reference": False}
