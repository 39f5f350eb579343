"""Generation-health diagnostics (LENS Section 6, "Generation health").

Each text gets six flags — empty/near-empty, unfinished at the token cap, repeated-character loop,
bracket/parenthesis loop, low-diversity n-gram loop, non-language — and four score components computed on word
tokens (CJK characters count as one token each): repeated-4-gram rate (1 − unique/total 4-grams), max 4-gram
frequency (share of the most frequent 4-gram), unique-token ratio and dominant-token rate (share of the most
frequent token). The compact score is the mean of ``rep4``, ``max4``, ``1 − unique`` and ``dominant``.

A text is degraded when a loop, emptiness or non-language flag is set, or the score exceeds ``score_threshold``
(scored only for texts with at least ``min_scored_tokens`` tokens, so a short correct answer is never called a
loop). ``unfinished`` (stopped at the token cap mid-sentence) is reported but is not by itself degradation: a
verbose answer cut at the cap is an answer when the text before the cut is coherent. A cut text is degraded only
when the text before the cut is not: then its score counts whatever its length (a capped text of a few words
repeated is a loop, not a short answer).

``nonlanguage`` catches fluent-looking strings that are not language and do not loop ("Compulsivschutzfraumimm-
welche Bundesverins…"), from word shapes no language's words take: a word of ``max_word_letters`` or more letters,
a run of ``max_consonant_run`` consonants (Latin and Cyrillic), a lower-to-upper case switch after a word's third
letter, or two scripts in one word. It fires when at least ``nonlanguage_min_words`` words, and
``nonlanguage_fraction`` of the words, have such a shape. Pseudo-words with a language's shape ("fledrabble",
"resuscice") need a lexicon or a language model to be caught.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_unlearn.errors import ConfigError

# The health flags of every report, in reading order; all but ``unfinished`` make a text degraded by themselves.
DEGENERATION_FLAGS = ("empty", "unfinished", "char_loop", "bracket_loop", "ngram_loop", "nonlanguage")
_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]|\w+|[^\w\s]", re.UNICODE)
_TERMINAL = tuple(".!?。！？…\"'”’)»")
_BRACKETS = "()[]{}<>（）【】"
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_CONSONANTS = frozenset("bcdfghjklmnpqrstvwxzбвгґджзйклмнпрстфхцчшщ")
_CASE_SWITCH = re.compile(r"[a-zа-яіїєґ][A-ZА-ЯІЇЄҐ]")


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
        min_scored_tokens: texts shorter than this get score 0 (too short to call repetitive), unless they were cut
            at the token cap.
        score_threshold: degraded when the compact score exceeds this.
        max_word_letters: a word of at least this many letters has a shape no language's words take (English
            "internationalization" has 20, German compounds reach the low 20s; glued pseudo-words run longer).
        max_consonant_run: a run of at least this many consonants inside a word likewise ("strengths" has 5).
        nonlanguage_min_words: the non-language flag needs at least this many such words …
        nonlanguage_fraction: … making up at least this share of the text's words.
    """

    min_tokens: int = 2
    min_alnum_chars: int = 3
    char_loop_repeats: int = 8
    bracket_run: int = 6
    bracket_fraction: float = 0.2
    ngram_loop_count: int = 4
    min_scored_tokens: int = 8
    score_threshold: float = 0.5
    max_word_letters: int = 25
    max_consonant_run: int = 6
    nonlanguage_min_words: int = 2
    nonlanguage_fraction: float = 0.15


def tokenize_words(text: str) -> list[str]:
    """Lower-cased word tokens; punctuation marks and CJK characters are single tokens."""
    return [t.lower() for t in _TOKEN.findall(text)]


def odd_words(text: str, thresholds: DegenerationThresholds | None = None) -> tuple[list[str], int]:
    """The words of ``text`` with a shape no language's words take (see the module docstring), and the number of
    words. CJK text has no such shapes and is not judged here."""
    th = thresholds or DegenerationThresholds()
    words = [w for w in _WORD.findall(text) if not ("\u3400" <= w[0] <= "\u9fff")]
    odd = []
    for word in words:
        lower = word.lower()
        run = longest = 0
        for ch in lower:
            run = run + 1 if ch in _CONSONANTS else 0
            longest = max(longest, run)
        scripts = {unicodedata.name(ch, "?").split(" ")[0] for ch in word}
        if (
            len(word) >= th.max_word_letters
            or longest >= th.max_consonant_run
            or _CASE_SWITCH.search(word, 2)  # not McDonald, iPhone: a switch after the word's third letter
            or len(scripts) > 1
        ):
            odd.append(word)
    return odd, len(words)


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
        raise ConfigError(f"hit_token_cap has {len(hit_token_cap)} entries for {len(texts)} texts; pass one per text.")
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
        unfinished = bool(hit_token_cap[i]) and not stripped.endswith(_TERMINAL) if hit_token_cap else False
        scored = len(tokens) >= th.min_scored_tokens or (unfinished and len(tokens) >= th.min_tokens)
        score = (rep4 + max4 + (1.0 - unique) + dominant) / 4.0 if scored else 0.0
        odd, n_words = odd_words(stripped, th)
        flags = {
            "empty": len(tokens) < th.min_tokens or alnum < th.min_alnum_chars,
            "unfinished": unfinished,
            "char_loop": char_loop.search(stripped) is not None,
            "bracket_loop": bracket_loop.search(stripped) is not None
            or (n_brackets >= th.bracket_run and n_brackets / non_space > th.bracket_fraction),
            "ngram_loop": bool(gram_counts) and max(gram_counts.values()) >= th.ngram_loop_count,
            "nonlanguage": len(odd) >= th.nonlanguage_min_words and len(odd) >= th.nonlanguage_fraction * n_words,
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
                "odd_words": odd[:5],
                "degraded": any(v for k, v in flags.items() if k != "unfinished") or score > th.score_threshold,
            }
        )
    return out


def degraded_rate(reports: Sequence[dict]) -> float:
    """g = D / N over ``degeneration_report`` rows."""
    if not reports:
        raise ConfigError("no reports: the degraded rate needs at least one text.")
    return sum(r["degraded"] for r in reports) / len(reports)
