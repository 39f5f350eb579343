"""Narrative labelers (signature, NLI, manual labels), the responsiveness judge, and their calibration against manual
labels."""

from lightning_unlearn.labelers.calibration import calibration_report, format_calibration_table, wilson_interval
from lightning_unlearn.labelers.manual_labels import (
    MANUAL_LABELS,
    TARGET_DOMINANT,
    TARGET_INCLUDED,
    TARGET_REJECTED,
    ManualLabels,
)
from lightning_unlearn.labelers.narrative_label import (
    INVALID,
    LABELS,
    NOT_REPRODUCED,
    REPRODUCED,
    NarrativeLabel,
    NarrativeLabeler,
    invalid_reason,
)
from lightning_unlearn.labelers.nli_labeler import NLILabeler
from lightning_unlearn.labelers.responsiveness_judge import JudgeHead, JudgeReading, ResponsivenessJudge
from lightning_unlearn.labelers.signature_labeler import SignatureLabeler

__all__ = [
    "INVALID",
    "LABELS",
    "MANUAL_LABELS",
    "NOT_REPRODUCED",
    "REPRODUCED",
    "TARGET_DOMINANT",
    "TARGET_INCLUDED",
    "TARGET_REJECTED",
    "ManualLabels",
    "NLILabeler",
    "NarrativeLabel",
    "NarrativeLabeler",
    "JudgeHead",
    "JudgeReading",
    "ResponsivenessJudge",
    "SignatureLabeler",
    "calibration_report",
    "format_calibration_table",
    "invalid_reason",
    "wilson_interval",
]
