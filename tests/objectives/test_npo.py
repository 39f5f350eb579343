import math

import pytest
import torch
from conftest import fit, nll_change

from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives import NPO, OptimizerConfig


def _batch(testbed):
    dm = ForgetRetainDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=2)
    dm.setup()
    return next(iter(dm.train_dataloader()))[0]


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_npo_starts_at_two_over_beta_log_two(testbed, kind):
    module = NPO(testbed.model_dir, AdapterConfig(kind=kind, dropout=0.0), beta=0.1)
    loss, _ = module.unlearning_loss(_batch(testbed))
    assert loss.item() == pytest.approx(2 / 0.1 * math.log(2), rel=1e-5)
    assert (module.reference_model is None) == (kind == "lora")  # LoRA: adapter disabled, no copy


def test_npo_reference_stays_the_start_model(testbed):
    module = NPO(testbed.model_dir, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-3))
    batch = _batch(testbed)["forget"]
    before = module.reference_logits(batch)
    fit(module, testbed, max_steps=3)
    assert torch.equal(module.reference_logits(batch), before)
    assert not torch.equal(module.model(input_ids=batch["input_ids"]).logits, before)


@pytest.mark.parametrize("kind,lr", [("lora", 1e-2), ("full", 1e-3)])
def test_npo_raises_forget_nll_more_than_retain(testbed, kind, lr):
    module = NPO(testbed.model_dir, AdapterConfig(kind=kind, dropout=0.0), OptimizerConfig(lr=lr))
    fit(module, testbed)
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > d_retain and d_forget > 1.0


def test_npo_checkpoint_leaves_out_the_reference_copy(testbed, tmp_path):
    module = NPO(testbed.model_dir, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-3))
    trainer = fit(module, testbed, max_steps=2, enable_checkpointing=True, default_root_dir=str(tmp_path))
    path = trainer.checkpoint_callback.best_model_path
    state = torch.load(path, weights_only=False)["state_dict"]
    assert not any(k.startswith("reference_model.") for k in state)
    reloaded = NPO.load_from_checkpoint(path)
    assert all(torch.equal(p, reloaded.model.state_dict()[k]) for k, p in module.model.state_dict().items())


def test_precomputed_reference_trains_exactly_like_the_reference_copy(testbed):
    runs = {}
    for reference in ("model", "precomputed"):
        torch.manual_seed(0)
        module = NPO(testbed.model_dir, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-3), reference=reference)
        fit(module, testbed, max_steps=5)
        runs[reference] = module
    assert runs["precomputed"].reference_model is None and runs["model"].reference_model is not None
    assert runs["precomputed"].reference_logps.shape == (4,)
    for (name, p), q in zip(runs["model"].model.named_parameters(), runs["precomputed"].model.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name


def test_precomputed_reference_logps_survive_a_checkpoint(testbed, tmp_path):
    module = NPO(testbed.model_dir, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-3), reference="precomputed")
    trainer = fit(module, testbed, max_steps=2, enable_checkpointing=True, default_root_dir=str(tmp_path))
    reloaded = NPO.load_from_checkpoint(trainer.checkpoint_callback.best_model_path)
    assert torch.equal(reloaded.reference_logps, module.reference_logps)
