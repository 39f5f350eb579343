""" "I don't know" answers (TOFU's idk baselines): a shipped list per LENS language and a seeded choice per row.

The lists (``idk_answers/<language>.txt``, one answer per line) follow TOFU's ``idontknow`` style: short, first-person
statements of not knowing, with no content about the question. A row's answer depends only on ``(seed, row index)``,
so every rank, epoch and resumed run gives a forget row the same idk answer (OpenUnlearning draws a new one from the
global RNG at every access).
"""

from __future__ import annotations

import random
from importlib import resources
from pathlib import Path

from lightning_unlearn.data.collate import encode_answer
from lightning_unlearn.errors import ConfigError, MissingPathError

IDK_LANGUAGES = ("en", "uk", "zh-Hans", "zh-Hant")


def load_idk_answers(source: str = "en") -> list[str]:
    """The idk answers of a shipped language (``en``, ``uk``, ``zh-Hans``, ``zh-Hant``) or of a text file (one
    answer per line; blank lines skipped)."""
    if source in IDK_LANGUAGES:
        text = resources.files("lightning_unlearn.data").joinpath(f"idk_answers/{source}.txt").read_text("utf-8")
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise MissingPathError(
                f"idk_answers={source!r} is neither a shipped language ({', '.join(IDK_LANGUAGES)}) nor a text file "
                "with one answer per line."
            )
        text = path.read_text("utf-8")
    answers = [line.strip() for line in text.splitlines() if line.strip()]
    if not answers:
        raise ConfigError(f"idk_answers={source!r} holds no answer; give at least one line.")
    return answers


def idk_choice(seed: int, index: int, count: int) -> int:
    """Which of ``count`` idk answers row ``index`` gets: a pure function of ``(seed, index)`` (a string seed is
    hashed with SHA-512 by ``random``, independent of ``PYTHONHASHSEED`` and platform)."""
    return random.Random(f"idk:{seed}:{index}").randrange(count)


class IdkAnswers:
    """The idk answer of each forget row, as text and as answer token ids.

    Args:
        source: a shipped language code or a text file (see :func:`load_idk_answers`).
        seed: seed of the per-row choice.
    """

    def __init__(self, source: str = "en", seed: int = 0) -> None:
        self.answers = load_idk_answers(source)
        self.seed = seed
        self._encoded: dict[int, list[int]] = {}

    def text(self, index: int) -> str:
        """The idk answer of forget row ``index`` (a pure function of the seed and the index).

        Args:
            index: the row's position in the forget set.

        Returns:
            One answer of :attr:`answers`.
        """
        return self.answers[idk_choice(self.seed, index, len(self.answers))]

    def token_ids(self, tokenizer, indices: list[int]) -> list[list[int]]:
        """Answer token ids (ending in EOS, as in a training pair) of the rows ``indices``."""
        choices = [idk_choice(self.seed, i, len(self.answers)) for i in indices]
        for c in set(choices) - self._encoded.keys():
            self._encoded[c] = encode_answer(tokenizer, self.answers[c])
        return [self._encoded[c] for c in choices]
