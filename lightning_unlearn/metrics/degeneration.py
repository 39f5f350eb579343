"""Generation-health diagnostics (LENS Section 6, "Generation health").

Each text gets five flags — empty/near-empty, unfinished at the token cap, repeated-character loop,
bracket/parenthesis loop, low-diversity n-gram loop — and four score components computed on word tokens
(CJK characters count as one token each): repeated-4-gram rate (1 − unique/total 4-grams), max 4-gram
frequency (share of the most frequent 4-gram), unique-token ratio and dominant-token rate (share of the most
frequent token). The compact score is the mean of ``rep4``, ``max4``, ``1 − unique`` and ``dominant``.
A text is degraded when any flag is set or the score exceeds ``score_threshold`` (scored only for texts with
at least ``min_scored_tokens`` tokens, so a short correct answer is never called a loop).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]|\w+|[^\w\s]", re.UNICODE)
_TERMINAL = tuple(".!?。！？…\"'”’)»")
_BRACKETS = "()[]{}<>（）【】"


@dataclass
class DegenerationThresholds:
    """Where each flag fires.

    Args:
        min_tokens: fewer word tokens than this is near-empty.
        min_alnum_chars: fewer letters/digits than this is near-empty.
        char_loop_repeats: a unit of 1–4 non-space characters repeated at least this many times in a row is a
            repeated-character loop.
        bracket_run: this many bracket characters in a row (spaces allowed) is a bracket loop.
        bracket_fraction: brackets making up more than this share of the non-space characters (with at least
            ``bracket_run`` of them) is also a bracket loop.
        ngram_loop_count: a word 4-gram occurring at least this many times is a low-diversity n-gram loop.
        min_scored_tokens: texts shorter than this get score 0 (too short to call repetitive).
        score_threshold: degraded when the compact score exceeds this.
    """

    min_tokens: int = 2
    min_alnum_chars: int = 3
    char_loop_repeats: int = 8
    bracket_run: int = 6
    bracket_fraction: float = 0.2
    ngram_loop_count: int = 4
    min_scored_tokens: int = 8
    score_threshold: float = 0.5


def tokenize_words(text: str) -> list[str]:
    """Lower-cased word tokens; punctuation marks and CJK characters are single tokens."""
    return [t.lower() for t in _TOKEN.findall(text)]


def _ngrams(tokens: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def degeneration_report(
    texts: Sequence[str],
    hit_token_cap: Sequence[bool] | None = None,
    thresholds: DegenerationThresholds | None = None,
) -> list[dict]:
    """One dict per text with its flags, score components, ``score`` and ``degraded``.

    Args:
        texts: generated answers (prompt removed).
        hit_token_cap: per text, whether generation stopped at ``max_new_tokens`` without an end-of-sequence;
            such a text is unfinished unless it ends with sentence-final punctuation. ``None``: never unfinished.
        thresholds: see :class:`DegenerationThresholds`.
    """
    th = thresholds or DegenerationThresholds()
    if hit_token_cap is not None and len(hit_token_cap) != len(texts):
        raise ValueError(f"hit_token_cap has {len(hit_token_cap)} entries for {len(texts)} texts; pass one per text.")
    char_loop = re.compile(r"(\S{1,4}?)\1{" + str(th.char_loop_repeats - 1) + ",}")
    bracket_loop = re.compile("(?:[" + re.escape(_BRACKETS) + r"]\s*){" + str(th.bracket_run) + ",}")
    out = []
    for i, text in enumerate(texts):
        tokens = tokenize_words(text)
        stripped = text.strip()
        alnum = sum(ch.isalnum() for ch in stripped)
        n_brackets = sum(ch in _BRACKETS for ch in stripped)
        non_space = max(sum(not ch.isspace() for ch in stripped), 1)
        grams = _ngrams(tokens, 4)
        gram_counts = Counter(grams)
        tok_counts = Counter(tokens)
        rep4 = 1.0 - len(gram_counts) / len(grams) if grams else 0.0
        max4 = max(gram_counts.values()) / len(grams) if grams else 0.0
        unique = len(tok_counts) / len(tokens) if tokens else 0.0
        dominant = max(tok_counts.values()) / len(tokens) if tokens else 0.0
        scored = len(tokens) >= th.min_scored_tokens
        score = (rep4 + max4 + (1.0 - unique) + dominant) / 4.0 if scored else 0.0
        flags = {
            "empty": len(tokens) < th.min_tokens or alnum < th.min_alnum_chars,
            "unfinished": bool(hit_token_cap[i]) and not stripped.endswith(_TERMINAL) if hit_token_cap else False,
            "char_loop": char_loop.search(stripped) is not None,
            "bracket_loop": bracket_loop.search(stripped) is not None
            or (n_brackets >= th.bracket_run and n_brackets / non_space > th.bracket_fraction),
            "ngram_loop": bool(gram_counts) and max(gram_counts.values()) >= th.ngram_loop_count,
        }
        out.append(
            {
                **flags,
                "rep4_rate": rep4,
                "max4_freq": max4,
                "unique_ratio": unique,
                "dominant_rate": dominant,
                "score": score,
                "num_tokens": len(tokens),
                "degraded": any(flags.values()) or score > th.score_threshold,
            }
        )
    return out


def degraded_rate(reports: Sequence[dict]) -> float:
    """g = D / N over ``degeneration_report`` rows."""
    if not reports:
        raise ValueError("no reports: the degraded rate needs at least one text.")
    return sum(r["degraded"] for r in reports) / len(reports)
