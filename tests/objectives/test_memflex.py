import pytest
import torch
from conftest import fit, nll_change

from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives import MemFlex, OptimizerConfig


@pytest.mark.parametrize("kind,lr", [("full", 1e-3), ("lora", 1e-2)])
def test_memflex_updates_only_localised_tensors_and_forgets(testbed, kind, lr):
    # The tiny model's gradients are ~1e-4 per element; the 1B threshold 6e-4 would select nothing here.
    module = MemFlex(
        testbed.model_dir, AdapterConfig(kind=kind, dropout=0.0), OptimizerConfig(lr=lr), gradient_threshold=1e-4
    )
    before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    fit(module, testbed)
    trainable = [n for n, p in module.model.named_parameters() if p.requires_grad]
    changed = {n for n, p in module.model.named_parameters() if not torch.equal(p, before[n])}
    assert 0 < len(module.selected) < len(trainable)
    assert changed and changed <= set(module.selected)
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > d_retain and d_forget > 1.0


def test_memflex_with_no_selected_tensor_says_which_threshold(testbed):
    module = MemFlex(testbed.model_dir, AdapterConfig(kind="full"), gradient_threshold=10.0)
    with pytest.raises(ValueError, match="gradient_threshold"):
        fit(module, testbed, max_steps=1)
