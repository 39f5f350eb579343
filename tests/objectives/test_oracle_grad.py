import pytest
import torch
from conftest import FORGET, fit, mean_nll, nll_change

from lightning_unlearn.masks import load_masks, union_mask
from lightning_unlearn.models import AdapterConfig, load_causal_lm
from lightning_unlearn.objectives import OptimizerConfig, OracleGrad
from lightning_unlearn.objectives.oracle_grad import merged_state_dict
from lightning_unlearn.strategies import MaskedSingleDeviceStrategy


def _forget_mask(testbed):
    packed, _ = load_masks(testbed.masks)
    return union_mask(packed, [0, 1, 2])


def test_oracle_grad_full_changes_only_forget_mask_elements(testbed):
    module = OracleGrad(testbed.model_dir, testbed.masks, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-3))
    assert (module.gamma, module.alpha, module.restrict_update_groups) == (5.0, 1.0, [0, 1, 2])
    before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    fit(module, testbed, strategy=MaskedSingleDeviceStrategy())
    mask = _forget_mask(testbed)
    for name, p in module.model.named_parameters():
        assert torch.equal(p[~mask[name]], before[name][~mask[name]]), name
    assert sum(int((p != before[n]).sum()) for n, p in module.model.named_parameters()) > 0
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > d_retain and d_forget > 0.5


def test_oracle_grad_lora_delta_is_confined_to_forget_mask(testbed):
    module = OracleGrad(
        testbed.model_dir, testbed.masks, AdapterConfig(kind="lora", dropout=0.0), OptimizerConfig(lr=1e-2)
    )
    fit(module, testbed)  # no masked strategy needed: the restriction is inside the adapted layers
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > d_retain and d_forget > 1.0
    merged = merged_state_dict(module.model, module.model.state_dict())
    start = load_causal_lm(testbed.model_dir)
    mask = _forget_mask(testbed)
    for name, w in start.state_dict().items():
        assert torch.equal(merged[name][~mask[name]], w[~mask[name]]), name
    start.load_state_dict(merged)
    assert mean_nll(start, testbed.tokenizer, FORGET) == pytest.approx(
        mean_nll(module.model, testbed.tokenizer, FORGET), rel=1e-4
    )


def test_oracle_grad_full_refuses_an_unmasked_strategy(testbed):
    module = OracleGrad(testbed.model_dir, testbed.masks, AdapterConfig(kind="full"))
    with pytest.raises(TypeError, match="MaskedSingleDeviceStrategy"):
        fit(module, testbed, max_steps=1)


def test_oracle_grad_rejects_masks_of_another_model(testbed, tmp_path):
    from lightning_unlearn.masks import save_masks

    packed, _ = load_masks(testbed.masks)
    packed.pop(next(iter(packed)))
    save_masks(tmp_path / "bad.safetensors", packed)
    with pytest.raises(ValueError, match="another model"):
        OracleGrad(testbed.model_dir, str(tmp_path / "bad.safetensors"), AdapterConfig(kind="full"))
