import pytest
from conftest import fit, nll_change

from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives import OptimizerConfig, SimNPO


@pytest.mark.parametrize("kind,lr", [("lora", 1e-2), ("full", 1e-3)])
def test_simnpo_raises_forget_nll_more_than_retain(testbed, kind, lr):
    module = SimNPO(testbed.model_dir, AdapterConfig(kind=kind, dropout=0.0), OptimizerConfig(lr=lr))
    assert (module.gamma, module.alpha, module.beta, module.delta) == (3.0, 0.01, 10.0, 1.5)  # Lacuna 1B defaults
    fit(module, testbed)
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > d_retain and d_forget > 1.0


def test_simnpo_rejects_nonpositive_beta(testbed):
    with pytest.raises(ValueError, match="beta"):
        SimNPO(testbed.model_dir, beta=0.0)
