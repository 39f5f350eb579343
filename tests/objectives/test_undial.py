"""UNDIAL on the tiny testbed: the start-model teacher, the adjusted target and its effect on the forget answers."""

import pytest
import torch
import torch.nn.functional as F
from conftest import fit, nll_change

from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.losses import IGNORE_INDEX
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives import UNDIAL, OptimizerConfig


def _batch(testbed):
    dm = ForgetRetainDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=2)
    dm.setup()
    return next(iter(dm.train_dataloader()))[0]


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_undial_with_strength_zero_starts_at_the_start_models_entropy(testbed, kind):
    # strength 0 and π_θ = π_ref: the target is p_θ itself, so the loss is the mean entropy over answer positions.
    module = UNDIAL(testbed.model_dir, AdapterConfig(kind=kind, dropout=0.0), strength=0.0)
    forget = _batch(testbed)["forget"]
    loss, _ = module.unlearning_loss({"forget": forget})
    with torch.no_grad():
        logits = module.model(input_ids=forget["input_ids"], attention_mask=forget["attention_mask"]).logits
    log_p = F.log_softmax(logits[:, :-1], -1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    mask = forget["labels"][:, 1:] != IGNORE_INDEX
    per_row = (entropy * mask).sum(-1) / mask.sum(-1)
    assert loss.item() == pytest.approx(per_row.mean().item(), rel=1e-5)
    assert (module.reference_model is None) == (kind == "lora")


def test_undial_with_a_retain_term_lowers_the_forget_answers_more_than_retain(testbed):
    # Without the retain term (OpenUnlearning's default α 0) this tiny model loses its retain answers too.
    module = UNDIAL(testbed.model_dir, AdapterConfig(kind="lora", dropout=0.0), OptimizerConfig(lr=1e-2), alpha=1.0)
    fit(module, testbed, max_steps=20)
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > d_retain and d_forget > 1.0
