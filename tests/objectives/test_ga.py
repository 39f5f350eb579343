from conftest import fit, nll_change

from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives import GradientAscent, OptimizerConfig


def test_gradient_ascent_raises_forget_nll_more_than_retain(testbed):
    module = GradientAscent(testbed.model_dir, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-3))
    trainer = fit(module, testbed)
    assert trainer.global_step == 20
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > d_retain and d_forget > 1.0
