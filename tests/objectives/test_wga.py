"""WGA and SatImp (token-weighted gradient ascent) on the tiny testbed."""

import pytest
import torch
from conftest import fit, nll_change

from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.losses import answer_token_logprobs, gd_loss, sequence_logprobs
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives import WGA, OptimizerConfig, SatImp


def _batch(testbed):
    dm = ForgetRetainDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=2)
    dm.setup()
    return next(iter(dm.train_dataloader()))[0]


def _logits(module, b):
    with torch.no_grad():
        return module.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits


@pytest.mark.parametrize("token_average", ["sequence", "batch"])
def test_wga_with_beta_zero_is_gradient_difference(testbed, token_average):
    module = WGA(testbed.model_dir, AdapterConfig(kind="lora", dropout=0.0), beta=0.0, gamma=2.0, alpha=0.5,
                 token_average=token_average)  # fmt: skip
    batch = _batch(testbed)
    loss, _ = module.unlearning_loss(batch)
    f = sequence_logprobs(_logits(module, batch["forget"]), batch["forget"]["labels"])
    r = sequence_logprobs(_logits(module, batch["retain"]), batch["retain"]["labels"])
    assert loss.item() == pytest.approx(gd_loss(*f, *r, 2.0, 0.5, token_average).item(), rel=1e-5)


def test_satimp_weights_each_forget_token_by_p_to_beta1_times_one_minus_p_to_beta2(testbed):
    module = SatImp(testbed.model_dir, AdapterConfig(kind="lora", dropout=0.0), beta1=2.0, beta2=3.0, alpha=0.0)
    batch = _batch(testbed)
    loss, _ = module.unlearning_loss(batch)
    token_logps, mask = answer_token_logprobs(_logits(module, batch["forget"]), batch["forget"]["labels"])
    p = token_logps.exp()
    per_row = (p**2 * (1 - p) ** 3 * token_logps * mask).sum(-1) / mask.sum(-1)
    assert loss.item() == pytest.approx(0.1 * per_row.mean().item(), rel=1e-5)  # γ 0.1: OU's SatImp config


@pytest.mark.parametrize("cls", [WGA, SatImp])
def test_token_weighted_ga_raises_forget_nll_more_than_retain(testbed, cls):
    module = cls(testbed.model_dir, AdapterConfig(kind="lora", dropout=0.0), OptimizerConfig(lr=1e-2), gamma=1.0)
    fit(module, testbed, max_steps=20)
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > d_retain and d_forget > 0.5
