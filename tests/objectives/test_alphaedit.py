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


def test_null_space_projector_and_update_by_hand():
    from lightning_unlearn.null_space import alphaedit_update, null_space_projector

    # Keys span e1 only: covariance diag(2, 0, 0) → the null space is span(e2, e3), P = diag(0, 1, 1).
    cov = torch.diag(torch.tensor([2.0, 0.0, 0.0]))
    projector = null_space_projector(cov, threshold=1e-3)
    assert torch.allclose(projector, torch.diag(torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)))
    # One key k = e2 with residual r = (3,): P(kkᵀ) + l2·I = diag(l2, 1 + l2, l2), P k r = (0, 3, 0)ᵀ
    # → update = (0, 3 / (1 + l2), 0)ᵀ; with l2 = 0.5 that is 2.0, and the retain key e1 gets no change.
    update = alphaedit_update(torch.tensor([[0.0], [1.0], [0.0]]), torch.tensor([[3.0]]), projector, l2=0.5)
    assert torch.allclose(update, torch.tensor([[0.0], [2.0], [0.0]], dtype=torch.float64))
    # An earlier edit batch's key e2 (C_prev = e2 e2ᵀ) makes the same edit smaller: 3 / (2 + l2) = 1.2.
    previous = torch.diag(torch.tensor([0.0, 1.0, 0.0]))
    again = alphaedit_update(torch.tensor([[0.0], [1.0], [0.0]]), torch.tensor([[3.0]]), projector, previous, l2=0.5)
    assert torch.allclose(again, torch.tensor([[0.0], [1.2], [0.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="one residual per key"):
        alphaedit_update(torch.zeros(3, 2), torch.zeros(1, 1), projector)
    with pytest.raises(ValueError, match="square"):
        null_space_projector(torch.zeros(2, 3), 1e-3)


def test_alphaedit_resume_keeps_its_projectors_and_earlier_keys(testbed, tmp_path):
    module = _alphaedit(testbed)
    fit(module, testbed, max_steps=2)
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    fresh = _alphaedit(testbed)
    fresh.on_load_checkpoint(checkpoint)
    assert set(fresh.projectors) == set(fresh.previous_keys) == {0, 1}
    for layer in (0, 1):
        assert torch.equal(fresh.projectors[layer], module.projectors[layer].cpu())
        assert torch.equal(fresh.previous_keys[layer], module.previous_keys[layer].cpu())
