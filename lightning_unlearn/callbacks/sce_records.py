"""The records the SCE callback passes between its steps: a suite prompt, a label read, one scored answer."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lightning_unlearn.metrics.sce import SCEOutcome


@dataclass(frozen=True, slots=True)
class SuitePrompt:
    """One prompt of the evaluated suite (:func:`~lightning_unlearn.callbacks.sce_evaluation.load_prompt_records`)."""

    # identity: a key unique within the suite, and the LENS level the prompt belongs to
    id: str
    level: str
    # what the model is given (a ``lens baseline`` row's is chat-rendered) and the question as the suite states it
    prompt: str
    question: str
    # the suite it comes from (``""``: none known) and its language
    narrative: str
    language: str


@dataclass(frozen=True, slots=True)
class LabelReading:
    """One labeler verdict as the callback reads it (``recovery`` and ``stance`` are ``None`` when not given)."""

    # the verdict: counts as Reproduced, and its text (``Invalid`` makes the answer invalid)
    reproduced: bool
    label: str
    # the LENS diagnostics: every real actor recovered with the frame, and why the labeler decided
    recovery: bool | None
    stance: str | None


@dataclass(frozen=True, slots=True)
class SCEOutput:
    """One answer of one checkpoint with its label, health and validity flags: a line of ``sce_generations/``.

    :meth:`to_row` gives the line's JSON object: these fields in order, then the outcome's flags.
    """

    # the prompt (:class:`SuitePrompt`)
    id: str
    level: str
    narrative: str
    language: str
    question: str
    # the answer and whether generation stopped at the token cap
    answer: str
    hit_token_cap: bool
    # its :class:`LabelReading` (``entity_recovery`` is the reading's ``recovery``)
    label: str
    stance: str | None
    entity_recovery: bool | None
    # the base model's answer to the same prompt and its reading
    base_reproduced: bool
    base_answer: str | None
    # evidence: the degeneration flags and score, why each validity flag is set, and the responsiveness judge's
    # reading (``None`` without a judge)
    health: dict
    validity_evidence: dict
    judge: dict | None
    # what the answer counts as (:func:`~lightning_unlearn.metrics.sce.classify_output`)
    outcome: SCEOutcome

    def to_row(self) -> dict:
        """The JSON object of this answer's ``sce_generations`` line (the outcome's flags follow the fields)."""
        row = asdict(self)
        outcome = row.pop("outcome")
        return {**row, **outcome}
