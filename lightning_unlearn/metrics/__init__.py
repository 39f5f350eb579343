"""Metric functions (torch / numpy / scikit-learn; no Lightning) and the ``torchmetrics.Metric`` objects built on
them (SCE, retain drift, memorization, extraction, MIA AUC) that any LightningModule can ``self.log``."""

from lightning_unlearn.metrics.degeneration import DegenerationThresholds, degeneration_report, degraded_rate
from lightning_unlearn.metrics.mask_auc import exact_auc, mask_auc, quantile_rank, weight_features
from lightning_unlearn.metrics.memorization import (
    AnswerMemorization,
    ExtractionRate,
    extracted,
    extraction_rate,
    memorization_scores,
)
from lightning_unlearn.metrics.mia import (
    MembershipInferenceAUC,
    gradnorm_scores,
    loss_scores,
    mia_auc,
    min_k_plus_plus_scores,
    min_k_scores,
    privleak,
    reference_scores,
    zlib_scores,
)
from lightning_unlearn.metrics.retain_drift import RetainDrift, finalize_retain_drift, retain_drift_sums
from lightning_unlearn.metrics.sce import (
    SuppressionCollapseEfficiency,
    classify_output,
    sce_breakdown,
    sce_counts,
    sce_score,
)
from lightning_unlearn.metrics.tofu import (
    forget_quality,
    mean_answer_nll,
    model_utility,
    rouge_l_recall,
    truth_ratio_score,
    truth_ratios,
)
from lightning_unlearn.metrics.utility import load_multiple_choice, multiple_choice_accuracy, option_logprobs

__all__ = [
    "AnswerMemorization",
    "ExtractionRate",
    "MembershipInferenceAUC",
    "RetainDrift",
    "SuppressionCollapseEfficiency",
    "classify_output",
    "sce_breakdown",
    "degeneration_report",
    "DegenerationThresholds",
    "degraded_rate",
    "exact_auc",
    "extracted",
    "extraction_rate",
    "finalize_retain_drift",
    "forget_quality",
    "gradnorm_scores",
    "load_multiple_choice",
    "loss_scores",
    "mask_auc",
    "mean_answer_nll",
    "memorization_scores",
    "mia_auc",
    "min_k_plus_plus_scores",
    "min_k_scores",
    "model_utility",
    "multiple_choice_accuracy",
    "option_logprobs",
    "privleak",
    "quantile_rank",
    "reference_scores",
    "retain_drift_sums",
    "rouge_l_recall",
    "sce_counts",
    "sce_score",
    "truth_ratio_score",
    "truth_ratios",
    "weight_features",
    "zlib_scores",
]
