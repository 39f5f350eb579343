import pytest
from conftest import fit, nll_change

from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives import GARetain, OptimizerConfig


def test_ga_retain_with_lora_forgets_and_anchors_retain(testbed):
    module = GARetain(testbed.model_dir, AdapterConfig(kind="lora", dropout=0.0), OptimizerConfig(lr=1e-2))
    fit(module, testbed, datamodule_kwargs={"random_answers": True})
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > d_retain and d_forget > 1.0


def test_ga_retain_kl_is_zero_at_start_and_loss_matches_terms(testbed):
    module = GARetain(testbed.model_dir, AdapterConfig(kind="lora", dropout=0.0), forget_weight=0.5)
    dm = ForgetRetainDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=2, random_answers=True)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))[0]
    loss, logs = module.unlearning_loss(batch)
    assert logs["retain_kl"].item() == pytest.approx(0.0, abs=1e-6)  # LoRA B = 0: policy == reference
    # loss = 0.5·(−NLL̄ forget) + NLL̄(mismatch) + 0: the mismatch NLL is loss + 0.5·forget NLL
    mismatch_nll = loss.item() + 0.5 * logs["forget_nll"].item()
    assert mismatch_nll > logs["forget_nll"].item()  # random answers are far less likely than memorised ones


def test_ga_retain_without_random_answers_says_how_to_fix(testbed):
    module = GARetain(testbed.model_dir, AdapterConfig(kind="lora"))
    with pytest.raises(KeyError, match="random_answers"):
        module.unlearning_loss({"forget": {}, "retain": {}})
