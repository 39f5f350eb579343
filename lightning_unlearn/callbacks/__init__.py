"""Lightning callbacks that evaluate every checkpoint and select checkpoints."""

from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.callbacks.checkpoint_selection import CheckpointSelection
from lightning_unlearn.callbacks.mask_auc_evaluation import MaskAUCEvaluation
from lightning_unlearn.callbacks.memorization_evaluation import MemorizationEvaluation
from lightning_unlearn.callbacks.retain_drift_evaluation import RetainDriftEvaluation
from lightning_unlearn.callbacks.sce_evaluation import SCEEvaluation
from lightning_unlearn.callbacks.utility_evaluation import UtilityEvaluation

__all__ = [
    "CheckpointEvaluator",
    "CheckpointSelection",
    "MaskAUCEvaluation",
    "MemorizationEvaluation",
    "RetainDriftEvaluation",
    "SCEEvaluation",
    "UtilityEvaluation",
]
