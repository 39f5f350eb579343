from conftest import fit, nll_change

from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives import GradientDifference, OptimizerConfig


def test_gradient_difference_keeps_retain_while_forgetting(testbed):
    module = GradientDifference(
        testbed.model_dir, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-3), gamma=1.0, alpha=1.0
    )
    fit(module, testbed)
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > 1.0
    assert d_retain < 0.5  # the retain descent term holds the retain answers
