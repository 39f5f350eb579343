import pytest
import torch
from conftest import fit, nll_change

from lightning_unlearn.objectives import AlphaEdit


def _alphaedit(testbed, **overrides):
    # Tiny-model scale: keys have norm ~0.1, so the ridge term l2 must be small for K Kᵀ to matter.
    kwargs = dict(layers=[0, 1], l2=1e-4, v_weight_decay=0.1, v_steps=30)
    kwargs.update(overrides)
    return AlphaEdit(testbed.model_dir, **kwargs)


def test_alphaedit_edits_down_proj_and_forgets_more_than_retains(testbed):
    module = _alphaedit(testbed)
    before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    trainer = fit(module, testbed, max_steps=2)
    assert trainer.global_step == 2
    changed = {n for n, p in module.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > 0.2 and d_forget > 5 * d_retain


def test_alphaedit_update_lies_in_the_null_space_of_retain_keys(testbed):
    module = _alphaedit(testbed)
    before = module.model.model.layers[0].mlp.down_proj.weight.detach().clone()
    fit(module, testbed, max_steps=1)
    delta = module.model.model.layers[0].mlp.down_proj.weight.detach() - before  # (d, d_ff)
    projector = module.projectors[0].float()
    # ΔW = (P · X)ᵀ, so ΔW (I − P) = 0: keys in the retain span (range of I − P) get no output change.
    assert torch.allclose(delta @ (torch.eye(len(projector)) - projector), torch.zeros_like(delta), atol=1e-5)
    assert delta.abs().max() > 0


def test_alphaedit_names_a_missing_layer(testbed):
    with pytest.raises(ValueError, match="layers"):
        AlphaEdit(testbed.model_dir, layers=[9])
