"""Greedy extraction per field: the Lacuna filter's measure of what a model has memorized, used by the chain's filter,
the separability check and the resurfacing attack's bookkeeping."""

from __future__ import annotations

from collections.abc import Sequence

from lightning_unlearn.data.pii import probe_qa
from lightning_unlearn.data.templates import TARGET_FIELDS
from lightning_unlearn.generation import generate
from lightning_unlearn.metrics.memorization import extracted


def extraction_rates(model, tokenizer, profiles: Sequence[dict], fields: Sequence[str] = TARGET_FIELDS, **gen_kwargs):
    """Greedy extraction per field: a profile counts when its answer contains the PII value
    (:func:`~lightning_unlearn.metrics.memorization.extracted`, the one definition ``MemorizationEvaluation`` uses).

    Returns ``(rates {field: fraction}, memorized {field: set of profile ids})``.
    """
    rates, memorized = {}, {}
    for field in fields:
        prompts = [probe_qa(p, field)["prompt"] for p in profiles]
        answers = generate(model, tokenizer, prompts, **gen_kwargs)
        hits = extracted([a[0] for a in answers], [p[field] for p in profiles])
        hit = {p["profile_id"] for p, h in zip(profiles, hits) if h}
        memorized[field] = hit
        rates[field] = len(hit) / max(len(profiles), 1)
    return rates, memorized
