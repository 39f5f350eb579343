"""Lightning callbacks that evaluate every checkpoint and select checkpoints.

Each evaluator runs when any ``ModelCheckpoint`` saves (and in ``validate``), appends one row per (step, family) to
``<log_dir>/checkpoint_metrics.jsonl`` and logs scalars to every logger. Add them to a run's YAML::

    trainer:
      callbacks:
        - class_path: lightning.pytorch.callbacks.ModelCheckpoint
          init_args: {every_n_train_steps: 10, save_top_k: -1, filename: "{step}"}
        - class_path: lightning_unlearn.callbacks.SCEEvaluation
          init_args:
            narrative: nato-forced-war
            language: en
            levels: [L0, L1, L2, L3, L3-special]
            labeler: {class_path: lightning_unlearn.labelers.SignatureLabeler}
        - class_path: lightning_unlearn.callbacks.RetainDriftEvaluation
          init_args: {records: runs/lens/retain.jsonl}
        - class_path: lightning_unlearn.callbacks.CheckpointSelection
          init_args: {collapse_boundary: 0.5}

Across runs: ``lightning-unlearn report RUN_DIR... --out DIR`` (heatmap + selection table).
"""

from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.callbacks.checkpoint_selection import CheckpointSelection
from lightning_unlearn.callbacks.log_progress import LogProgress
from lightning_unlearn.callbacks.mask_auc_evaluation import MaskAUCEvaluation
from lightning_unlearn.callbacks.memorization_evaluation import MemorizationEvaluation
from lightning_unlearn.callbacks.mia_evaluation import MIAEvaluation
from lightning_unlearn.callbacks.quantization_attack import QuantizationAttack
from lightning_unlearn.callbacks.relearning_attack import RelearningAttack
from lightning_unlearn.callbacks.retain_drift_evaluation import RetainDriftEvaluation
from lightning_unlearn.callbacks.sce_evaluation import SCEEvaluation
from lightning_unlearn.callbacks.stop_aware_checkpoint import StopAwareCheckpoint
from lightning_unlearn.callbacks.stop_listener import StopListener
from lightning_unlearn.callbacks.stop_rule import StopRule
from lightning_unlearn.callbacks.tofu_evaluation import TOFUEvaluation
from lightning_unlearn.callbacks.utility_evaluation import UtilityEvaluation

__all__ = [
    "CheckpointEvaluator",
    "CheckpointSelection",
    "LogProgress",
    "MaskAUCEvaluation",
    "MemorizationEvaluation",
    "MIAEvaluation",
    "QuantizationAttack",
    "RelearningAttack",
    "RetainDriftEvaluation",
    "SCEEvaluation",
    "StopAwareCheckpoint",
    "StopListener",
    "StopRule",
    "TOFUEvaluation",
    "UtilityEvaluation",
]
