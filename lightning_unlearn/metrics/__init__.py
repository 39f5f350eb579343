"""Pure metric functions (torch / numpy / scikit-learn; no Lightning)."""

from lightning_unlearn.metrics.degeneration import DegenerationThresholds, degeneration_report, degraded_rate
from lightning_unlearn.metrics.mask_auc import exact_auc, mask_auc, quantile_rank, weight_features
from lightning_unlearn.metrics.memorization import extracted, extraction_rate, memorization_scores
from lightning_unlearn.metrics.retain_drift import finalize_retain_drift, retain_drift_sums
from lightning_unlearn.metrics.sce import sce_counts, sce_score
from lightning_unlearn.metrics.utility import load_multiple_choice, multiple_choice_accuracy, option_logprobs

__all__ = [
    "DegenerationThresholds",
    "degeneration_report",
    "degraded_rate",
    "exact_auc",
    "extracted",
    "extraction_rate",
    "finalize_retain_drift",
    "load_multiple_choice",
    "mask_auc",
    "memorization_scores",
    "multiple_choice_accuracy",
    "option_logprobs",
    "quantile_rank",
    "retain_drift_sums",
    "sce_counts",
    "sce_score",
    "weight_features",
]
