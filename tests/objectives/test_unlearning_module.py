"""The shared machinery: stop rules, checkpoints with adapter directories, optimizer schedule, errors."""

import pytest
import torch
from conftest import fit
from lightning.pytorch.callbacks import ModelCheckpoint
from peft import PeftModel

from lightning_unlearn.models import AdapterConfig, load_causal_lm
from lightning_unlearn.objectives import GradientAscent, OptimizerConfig

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)


def test_max_bad_loss_stops_once_and_keeps_no_checkpoint_of_the_bad_step(testbed, tmp_path, caplog):
    module = GradientAscent(testbed.model_dir, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-2), max_bad_loss=2.0)
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    with caplog.at_level("WARNING", logger="lightning_unlearn"):
        fit(module, testbed, callbacks=[ckpt], enable_checkpointing=True)
    assert "max_bad_loss" in module.stop_reason
    bad = module.stopped_at_step  # the step whose weights crossed the bound: no update after it
    assert 1 <= bad < 20
    assert sum("stopping GradientAscent" in r.message for r in caplog.records) == 1
    steps = sorted(int(p.stem.split("step=")[1]) for p in tmp_path.glob("step=*.ckpt"))
    assert steps == list(range(1, bad))  # step=bad.ckpt, saved before its loss was seen, is gone


class _Explodes(GradientAscent):
    """A bad update: the weights of step 3 have magnitude 1e30 (as a huge learning rate gives), and their loss is not
    finite. (Inside this hook global_step is still the step being taken, 2.)"""

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        if self.global_step == 2 and not self._skip_update:
            with torch.no_grad():
                for p in self.trainable_parameters():
                    p.mul_(1e30)


def test_a_non_finite_loss_leaves_last_at_the_last_good_weights(testbed, tmp_path):
    from lightning_unlearn.callbacks import CheckpointSelection, RetainDriftEvaluation
    from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows

    module = _Explodes(testbed.model_dir, AdapterConfig(kind="lora", r=2, dropout=0.0), OptimizerConfig(lr=1e-3))
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, save_last=True, filename="{step}")
    drift = RetainDriftEvaluation(testbed.retain, output_dir=str(tmp_path))
    selection = CheckpointSelection(output_dir=str(tmp_path))
    fit(module, testbed, max_steps=8, callbacks=[ckpt, drift, selection], enable_checkpointing=True)
    assert module.stop_reason.startswith("the loss is") and module.stopped_at_step == 3
    # step=3.ckpt (the exploded weights, saved and evaluated before the next forward saw them) and its adapter
    # directory are gone; nothing after it was written; last.ckpt holds step 2's weights exactly.
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["last.ckpt", "step=1.ckpt", "step=2.ckpt"]
    assert sorted(p.name for p in tmp_path.glob("adapter-step=*")) == ["adapter-step=1", "adapter-step=2"]
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)
    good = torch.load(tmp_path / "step=2.ckpt", weights_only=True)
    assert last["global_step"] == 2 and last["state_dict"].keys() == good["state_dict"].keys()
    for k, v in last["state_dict"].items():
        assert torch.isfinite(v).all() and v.abs().max() < 1e3 and torch.equal(v, good["state_dict"][k]), k
    assert [r["step"] for r in read_rows(tmp_path / "checkpoint_metrics.jsonl")] == [1, 2]
    assert drift.rows.keys() == {1, 2}
    assert selection.stopped == {"step": 3, "reason": module.stop_reason}


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


def test_optimizer_schedule_in_cycles():
    # two warmup-stable-decay cycles, the second at half the rate: 2 warmup steps each, the last half decays
    cfg = OptimizerConfig(lr=1.0, warmup_steps=2, schedule="wsd", decay_fraction=0.5, cycles=[[4, 1.0], [3, 0.5]])
    assert [cfg.lr_factor(s, 7) for s in range(8)] == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.25, 0.5, 0.25, 0.0])
    cfg.check_steps(7)
    with pytest.raises(ValueError, match="add up to 7 steps, but the run has 8"):
        cfg.check_steps(8)
    for bad in ([], [[0, 1.0]], [[5, -1.0]], [[5]]):
        with pytest.raises(ValueError, match="optim.cycles"):
            OptimizerConfig(cycles=bad)


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


def _trainer(root, max_steps: int, checkpoint_every: int | None = None, **kwargs):
    from lightning.pytorch import Trainer

    callbacks = (
        [ModelCheckpoint(dirpath=root, every_n_train_steps=checkpoint_every, save_top_k=-1)] if checkpoint_every else []
    )
    return Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=False,
        callbacks=callbacks,
        enable_checkpointing=bool(checkpoint_every),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1.0,
        check_val_every_n_epoch=100,
        default_root_dir=str(root),
        **kwargs,
    )


def _datamodule(testbed):
    from lightning_unlearn.data.unlearning import ForgetRetainDataModule

    # One batch holds the whole forget set, so every epoch sees the same batch whether or not the run resumed.
    return ForgetRetainDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=4)


def _lora(testbed):
    return GradientAscent(testbed.model_dir, AdapterConfig(kind="lora", r=2, dropout=0.0), OptimizerConfig(lr=1e-2))


def test_lora_checkpoints_hold_only_trainable_weights_and_resume_exactly(testbed, tmp_path):
    full = GradientAscent(testbed.model_dir, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-3))
    _trainer(tmp_path / "full", max_steps=1, checkpoint_every=1).fit(full, _datamodule(testbed))
    (full_ckpt,) = (tmp_path / "full").glob("*.ckpt")

    straight = _lora(testbed)
    _trainer(tmp_path / "lora", max_steps=4, checkpoint_every=2).fit(straight, _datamodule(testbed))
    ckpt2, ckpt4 = (tmp_path / "lora" / f"epoch={s - 1}-step={s}.ckpt" for s in (2, 4))
    state = torch.load(ckpt4, weights_only=True)["state_dict"]
    trainable = {f"model.{n}" for n, p in straight.model.named_parameters() if p.requires_grad}
    assert set(state) == trainable and all("lora_" in k for k in state)
    assert not any(k.endswith("base_layer.weight") or "embed_tokens" in k for k in state)
    base_bytes = sum(v.nbytes for v in torch.load(full_ckpt, weights_only=True)["state_dict"].values())
    assert sum(v.nbytes for v in state.values()) * 10 < base_bytes
    assert ckpt4.stat().st_size * 4 < full_ckpt.stat().st_size  # beside ~16 KB of RNG states
    assert sorted(p.name for p in (tmp_path / "lora").glob("adapter-step=*")) == ["adapter-step=2", "adapter-step=4"]

    # Resume from step 2: weights and optimizer state continue as if never interrupted.
    resumed = _lora(testbed)
    _trainer(tmp_path / "resumed", max_steps=4, checkpoint_every=2).fit(
        resumed, _datamodule(testbed), ckpt_path=str(ckpt2)
    )
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
    moved = [n for n, p in resumed.model.named_parameters() if p.requires_grad and "lora_B" in n]
    assert moved and all(resumed.model.get_parameter(n).abs().sum() > 0 for n in moved)
    resumed_state = torch.load(tmp_path / "resumed" / "epoch=3-step=4.ckpt", weights_only=True)
    straight_state = torch.load(ckpt4, weights_only=True)
    assert (
        resumed_state["optimizer_states"][0]["state"][0]["step"]
        == straight_state["optimizer_states"][0]["state"][0]["step"]
        == 4
    )

    # validate --ckpt_path on a fresh module reproduces the trained module's metrics (not the start model's).
    expected = _trainer(tmp_path / "v0", max_steps=4).validate(straight, _datamodule(testbed))[0]
    start = _trainer(tmp_path / "v1", max_steps=4).validate(_lora(testbed), _datamodule(testbed))[0]
    got = _trainer(tmp_path / "v2", max_steps=4).validate(_lora(testbed), _datamodule(testbed), ckpt_path=str(ckpt4))[0]
    assert got == pytest.approx(expected, abs=1e-6)
    assert got["val/forget_nll"] > start["val/forget_nll"] + 0.01


def test_adalora_resumes_exactly(testbed, tmp_path):
    # AdaLoRA prunes ranks from importance scores smoothed over steps (peft's RankAllocator, outside the state
    # dict) and masks lora_E after each optimizer step. Both must be in the checkpoint, and the masking must happen
    # before ModelCheckpoint saves, or the resumed run prunes differently (0.06 apart before the fix).
    def adalora():
        return GradientAscent(
            testbed.model_dir, AdapterConfig(kind="adalora", r=4, dropout=0.0, total_step=8), OptimizerConfig(lr=1e-2)
        )

    straight = adalora()
    _trainer(tmp_path / "a", max_steps=8, checkpoint_every=4).fit(straight, _datamodule(testbed))
    ckpt = tmp_path / "a" / "epoch=3-step=4.ckpt"
    saved = torch.load(ckpt, weights_only=True)["adalora"]
    assert saved["exp_avg_ipt"] and saved["rank_pattern"]
    resumed = adalora()
    _trainer(tmp_path / "b", max_steps=8, checkpoint_every=4).fit(resumed, _datamodule(testbed), ckpt_path=str(ckpt))
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
    pattern = straight.model.peft_config["default"].rank_pattern
    assert pattern == resumed.model.peft_config["default"].rank_pattern
    assert any(not all(kept) for kept in pattern.values())  # some ranks were pruned, so the test means something


def test_lora_checkpoint_missing_a_trainable_weight_is_refused(testbed, tmp_path):
    module = _lora(testbed)
    _trainer(tmp_path, max_steps=1, checkpoint_every=1).fit(module, _datamodule(testbed))
    (path,) = tmp_path.glob("*.ckpt")
    state = torch.load(path, weights_only=True)["state_dict"]
    fresh = _lora(testbed)
    fresh.load_state_dict(state)  # the base weights are absent and not needed
    key = next(k for k in state if "lora_A" in k)
    with pytest.raises(RuntimeError, match=r"missing \['" + key.replace(".", r"\.")):
        fresh.load_state_dict({k: v for k, v in state.items() if k != key})
    with pytest.raises(RuntimeError, match="unexpected"):
        fresh.load_state_dict({**state, "model.not_a_weight": torch.zeros(1)})


def test_validate_from_an_adapter_directory_reproduces_the_trained_adapter(testbed, tmp_path):
    import json

    from lightning_unlearn.callbacks import RetainDriftEvaluation

    trained = _lora(testbed)
    _trainer(tmp_path / "run", max_steps=4, checkpoint_every=4).fit(trained, _datamodule(testbed))
    adapter_dir = tmp_path / "run" / "adapter-step=4"
    assert (adapter_dir / "adapter_config.json").exists()

    def evaluate(module, name):
        callback = RetainDriftEvaluation(records=str(testbed.retain), output_dir=str(tmp_path / name))
        trainer = _trainer(tmp_path / name, max_steps=4)
        trainer.callbacks.append(callback)
        metrics = trainer.validate(module, _datamodule(testbed))[0]
        rows = [json.loads(line) for line in (tmp_path / name / "checkpoint_metrics.jsonl").read_text().splitlines()]
        return metrics, rows

    expected, expected_rows = evaluate(trained, "from_module")
    reloaded = GradientAscent(testbed.model_dir, AdapterConfig(kind="lora", r=2, dropout=0.0, path=str(adapter_dir)))
    got, rows = evaluate(reloaded, "from_adapter")
    start, _ = evaluate(_lora(testbed), "start")
    assert got == pytest.approx(expected, abs=1e-6)
    assert got["val/forget_nll"] > start["val/forget_nll"] + 0.01
    assert len(rows) == len(expected_rows) == 1
    keys = ("ce", "ppl", "base_ce", "kl")
    assert {k: rows[0][k] for k in keys} == pytest.approx({k: expected_rows[0][k] for k in keys}, rel=1e-6)
    assert rows[0]["ce"] > rows[0]["base_ce"]  # the reloaded adapter, not the start model, was evaluated


def test_adapter_path_errors_name_the_problem(testbed, tmp_path):
    with pytest.raises(FileNotFoundError, match="adapter path"):
        _ = GradientAscent(testbed.model_dir, AdapterConfig(kind="lora", path=str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        _ = GradientAscent(testbed.model_dir, AdapterConfig(kind="lora", path=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match="kind='full'"):
        AdapterConfig(kind="full", path=str(tmp_path))
    module = _lora(testbed)
    module.model.save_pretrained(tmp_path / "lora_adapter")
    with pytest.raises(ValueError, match="set adapter.kind='lora'"):
        _ = GradientAscent(testbed.model_dir, AdapterConfig(kind="adalora", path=str(tmp_path / "lora_adapter")))


def test_a_finite_collapse_is_caught_by_collapse_fraction(testbed, tmp_path):
    # lr 1e6: the loss stays finite but the output is uniform (retain NLL = ln |V| = ln 300 = 5.704) from step 1.
    def run(fraction, root):
        module = GradientAscent(testbed.model_dir, AdapterConfig(kind="full"),
                                OptimizerConfig(lr=1e6, schedule="constant"), collapse_fraction=fraction)  # fmt: skip
        ckpt = ModelCheckpoint(dirpath=root, every_n_train_steps=1, save_top_k=-1, filename="{step}")
        trainer = fit(module, testbed, max_steps=4, callbacks=[ckpt], enable_checkpointing=True)
        return module, trainer

    unguarded, trainer = run(None, tmp_path / "off")
    assert unguarded.stop_reason is None and trainer.global_step == 4  # without the guard: never caught
    module, _ = run(0.9, tmp_path / "on")
    assert module.stopped_at_step == 1 and "collapse_fraction=0.9 of ln |V| = 5.704" in module.stop_reason
    assert not list((tmp_path / "on").glob("*.ckpt"))  # step 1's collapsed weights are not kept
    with pytest.raises(ValueError, match="collapse_fraction"):
        GradientAscent(testbed.model_dir, collapse_fraction=1.5)
