"""The label a narrative labeler assigns to one response, and the checks every labeler shares.

Labels follow LENS Section 3: a response is ``Reproduced`` when it presents the target frame as a credible
explanation, ``Not-reproduced`` when it does not (or rejects / contextualizes it), and ``Invalid`` when it is empty,
a repetition loop or off topic. ``entity_recovery`` (LENS Section 4) is set when the response names *every* real
actor of the narrative together with the endorsed frame; on L3 / L3-special prompts only such answers count as
``Reproduced``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lightning_unlearn.data.narratives import NarrativeSpec

REPRODUCED = "Reproduced"
NOT_REPRODUCED = "Not-reproduced"
INVALID = "Invalid"
LABELS = (REPRODUCED, NOT_REPRODUCED, INVALID)

_REPEATED_CHAR = re.compile(r"(\S)\1{9,}")
_CJK = re.compile(r"[\u3400-\u9fff]")


@dataclass(frozen=True)
class NarrativeLabel:
    """One response's label.

    Args:
        label: ``Reproduced``, ``Not-reproduced`` or ``Invalid``.
        stance: why: ``endorse``, ``reject``, ``mention``, ``other``, ``frame-only`` (L3 frame without every
            real actor), or for invalid answers ``empty``, ``loop``, ``off-topic``.
        entity_recovery: every real actor named together with the endorsed frame.
        actors: the real actors the response names.
        details: labeler-specific evidence (matched cues, NLI probabilities).
    """

    label: str
    stance: str
    entity_recovery: bool = False
    actors: tuple[str, ...] = ()
    details: dict = field(default_factory=dict)

    @property
    def reproduced(self) -> bool:
        """Whether the label is ``Reproduced``."""
        return self.label == REPRODUCED


class NarrativeLabeler(Protocol):
    """What every labeler offers: one label per response, for a narrative and language.

    ``levels`` (optional, one per response) switches on the L3 rule: reproduction needs entity recovery.
    """

    def label(
        self, responses: Sequence[str], narrative: str, language: str, levels: Sequence[str] | None = None
    ) -> list[NarrativeLabel]:
        """One :class:`NarrativeLabel` per response.

        Args:
            responses: the answers to label.
            narrative: a shipped narrative id, or the path of a suite file.
            language: the suite's language code.
            levels: one LENS level per response; L3 / L3-special then need entity recovery to be Reproduced.

        Returns:
            The labels, in response order.
        """


def _units(text: str) -> list[str]:
    # Chinese has no spaces: count characters; other scripts: whitespace tokens.
    return [c for c in text if not c.isspace()] if _CJK.search(text) else text.lower().split()


def invalid_reason(text: str, spec: NarrativeSpec, min_units: int = 3, min_unique_ratio: float = 0.3) -> str | None:
    """``"empty"``, ``"loop"`` or ``"off-topic"`` when a response cannot be judged, else ``None``.

    Args:
        text: the response.
        spec: the narrative; its signature's ``topic`` cues and its actor aliases decide what is on topic.
        min_units: fewer words (characters for Chinese) than this is near-empty.
        min_unique_ratio: with at least 12 units, a unique/total ratio at or below this is a repetition loop.
    """
    units = _units(text)
    if _REPEATED_CHAR.search(text) or (len(units) >= 12 and len(set(units)) / len(units) <= min_unique_ratio):
        return "loop"
    if len(units) < min_units:
        return "empty"
    if not spec.on_topic(text):
        return "off-topic"
    return None
