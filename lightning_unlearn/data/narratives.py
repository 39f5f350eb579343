"""LENS narrative prompt suites: one record per prompt, loaded from JSON files shipped in ``data/suites/``.

A suite file describes one narrative (``<narrative id>.json``). For every language it holds

- ``prompts``: level → list of prompt texts (levels L0 direct, L1 attributed, L2 contrastive, L3 abstract A/B/C
  with no real actor named, L3-special entity recovery; LENS Section 4, Table 2);
- ``signature``: the frame's lexical signature used by :class:`~lightning_unlearn.labelers.SignatureLabeler`:
  ``components`` (name → regex alternatives; every component must match for the frame to be present),
  ``rejection`` (cues that discredit or contextualize the frame), ``topic`` (cues that the answer is on topic)
  optionally ``negation`` (cues that, just before a component match, negate it) and ``negatable`` (the components a
  negation can flip; default all — an actor component such as *United States* is left out, since "no longer serves
  American interests" does not negate the actor);
- ``actors``: real actor → aliases, used for L3 entity recovery (all actors must be recovered);
- ``hypotheses``: short NLI hypotheses for ``endorse``, ``mention`` and ``reject``.

In the ``compact`` condition the localized compact-response instruction (LENS Section 3) is appended to each
prompt; ``unrestricted`` leaves the prompt as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

LANGUAGES = ("en", "uk", "zh-Hans", "zh-Hant")
LEVELS = ("L0", "L1", "L2", "L3", "L3-special")
CONDITIONS = ("compact", "unrestricted")
# Levels whose prompts mask the real actors; reproduction there requires entity recovery (LENS Section 4).
ABSTRACT_LEVELS = ("L3", "L3-special")
COMPACT_INSTRUCTION = {
    "en": "Answer in 1–2 sentences.",
    "uk": "Дайте відповідь 1–2 реченнями.",
    "zh-Hans": "请用1–2句话回答。",
    "zh-Hant": "請用1–2句話回答。",
}
HYPOTHESIS_KINDS = ("endorse", "mention", "reject")
# Scripts written without spaces: aliases match as substrings, not as whole words.
_UNSPACED = ("zh-Hans", "zh-Hant")
_SUITE_KEYS = {"narrative", "title", "description", "languages"}
_LANGUAGE_KEYS = {"signature", "actors", "hypotheses", "prompts", "compact_instruction"}
_SIGNATURE_KEYS = {"description", "components", "rejection", "topic", "negation", "negatable"}


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a suite.

    Args:
        narrative: narrative id (the suite file's stem).
        language: ``en``, ``uk``, ``zh-Hans`` or ``zh-Hant``.
        level: ``L0``, ``L1``, ``L2``, ``L3`` or ``L3-special``.
        variant: 1-based index of the prompt within its level.
        prompt: the text given to the model (with the compact instruction in the compact condition).
        condition: ``compact`` or ``unrestricted``.
    """

    narrative: str
    language: str
    level: str
    variant: int
    prompt: str
    condition: str

    @property
    def id(self) -> str:
        """A stable key: ``narrative/language/level/variant/condition``."""
        return f"{self.narrative}/{self.language}/{self.level}/{self.variant:02d}/{self.condition}"

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "narrative": self.narrative,
            "language": self.language,
            "level": self.level,
            "variant": self.variant,
            "condition": self.condition,
            "prompt": self.prompt,
        }


@dataclass(frozen=True)
class FrameSignature:
    """Compiled lexical signature of a narrative frame in one language (see the module docstring)."""

    components: dict[str, list[re.Pattern]]
    rejection: list[re.Pattern]
    topic: list[re.Pattern]
    negation: list[re.Pattern]
    negatable: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class NarrativeSpec:
    """Everything a suite says about one narrative in one language."""

    narrative: str
    language: str
    title: str
    signature: FrameSignature
    actors: dict[str, list[str]]
    hypotheses: dict[str, list[str]]
    prompts: dict[str, list[str]]
    compact_instruction: str
    _actor_patterns: dict[str, re.Pattern] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        patterns = {name: _alias_pattern(aliases, self.language) for name, aliases in self.actors.items()}
        object.__setattr__(self, "_actor_patterns", patterns)

    def actors_in(self, text: str) -> list[str]:
        """The actors (canonical names) that ``text`` names through any alias."""
        return [name for name, pattern in self._actor_patterns.items() if pattern.search(text)]

    def on_topic(self, text: str) -> bool:
        """Whether ``text`` matches a topic cue of the signature or names an actor."""
        return any(p.search(text) for p in self.signature.topic) or bool(self.actors_in(text))


# Default negation cues per language; a cue within the window before a component match negates it.
DEFAULT_NEGATION = {
    "en": [r"\b(not|no|never|nor|neither|hardly|rather than|instead of|without)\b", r"n't\b"],
    "uk": [r"(?<!\w)(не|ні|ані|жодн\w*|аж ніяк|замість)(?!\w)"],
    "zh-Hans": [r"(不|并非|没有|未|无|非|绝非)"],
    "zh-Hant": [r"(不|並非|沒有|未|無|非|絕非)"],
}


def _alias_pattern(aliases: Sequence[str], language: str) -> re.Pattern:
    """One regex for an actor's aliases.

    Latin and Cyrillic aliases match at a word start and may take an inflectional ending (``Russia`` matches
    ``Russian``, ``Україн`` matches ``України``). All-caps aliases (``US``, ``NATO``) match case-sensitively so
    the pronoun "us" is not the United States. Chinese aliases match as substrings.
    """
    parts = []
    for alias in aliases:
        esc = re.escape(alias)
        if language in _UNSPACED:
            parts.append(esc)
        elif alias.isupper() or (alias.replace(".", "").isupper() and "." in alias):
            parts.append(rf"(?-i:(?<!\w){esc}(?!\w))")
        else:
            parts.append(rf"(?<!\w){esc}\w*")
    return re.compile("|".join(parts), re.IGNORECASE)


def suites_dir() -> Path:
    """The folder of shipped suite files inside the installed package."""
    return Path(str(resources.files("lightning_unlearn") / "data" / "suites"))


def known_narratives(directory: str | Path | None = None) -> list[str]:
    """Narrative ids of the suites in ``directory`` (default: the shipped suites)."""
    folder = Path(directory) if directory is not None else suites_dir()
    return sorted(p.stem for p in folder.glob("*.json"))


def compile_patterns(patterns: Sequence[str], where: str) -> list[re.Pattern]:
    """Case-insensitive regexes of ``patterns``; a bad one raises naming ``where`` and the pattern."""
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p, re.IGNORECASE))
        except re.error as err:
            raise ValueError(f"{where}: invalid regular expression {p!r} ({err}).") from err
    return out


def _check_keys(obj: dict, allowed: set[str], where: str, required: set[str] | None = None) -> None:
    unknown = set(obj) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; allowed keys are {sorted(allowed)}.")
    missing = (required or set()) - set(obj)
    if missing:
        raise ValueError(f"{where}: missing keys {sorted(missing)}.")


@lru_cache(maxsize=32)
def _read_suite(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    _check_keys(data, _SUITE_KEYS, path, required={"narrative", "languages"})
    if data["narrative"] != Path(path).stem:
        raise ValueError(f"{path}: narrative id {data['narrative']!r} does not match the file name.")
    return data


def _suite_path(narrative: str, directory: str | Path | None) -> Path:
    folder = Path(directory) if directory is not None else suites_dir()
    path = folder / f"{narrative}.json"
    if not path.is_file():
        known = ", ".join(known_narratives(folder)) or "(none)"
        raise ValueError(f"unknown narrative {narrative!r}; known narratives: {known}.")
    return path


def load_narrative(narrative: str, language: str, directory: str | Path | None = None) -> NarrativeSpec:
    """The signature, actors, hypotheses and prompts of one narrative in one language.

    Raises:
        ValueError: unknown narrative (the message lists the known ones), a language the suite lacks, or a
            malformed suite file.
    """
    path = _suite_path(narrative, directory)
    data = _read_suite(str(path))
    languages = data["languages"]
    if language not in languages:
        raise ValueError(
            f"narrative {narrative!r} has no {language!r} suite; available languages: {', '.join(languages)}."
        )
    where = f"{path} [{language}]"
    lang = languages[language]
    _check_keys(lang, _LANGUAGE_KEYS, where, required={"signature", "actors", "hypotheses", "prompts"})
    sig = lang["signature"]
    _check_keys(sig, _SIGNATURE_KEYS, f"{where} signature", required={"components", "rejection", "topic"})
    if not sig["components"]:
        raise ValueError(f"{where} signature: at least one component is required.")
    negatable = tuple(sig.get("negatable", list(sig["components"])))
    unknown_components = sorted(set(negatable) - set(sig["components"]))
    if unknown_components:
        raise ValueError(f"{where} signature.negatable names unknown components {unknown_components}.")
    signature = FrameSignature(
        components={k: compile_patterns(v, f"{where} signature.{k}") for k, v in sig["components"].items()},
        rejection=compile_patterns(sig["rejection"], f"{where} signature.rejection"),
        topic=compile_patterns(sig["topic"], f"{where} signature.topic"),
        negation=compile_patterns(
            sig.get("negation", DEFAULT_NEGATION.get(language, [])), f"{where} signature.negation"
        ),
        negatable=negatable,
        description=sig.get("description", ""),
    )
    unknown_levels = set(lang["prompts"]) - set(LEVELS)
    if unknown_levels:
        raise ValueError(f"{where}: unknown levels {sorted(unknown_levels)}; levels are {', '.join(LEVELS)}.")
    hypotheses = lang["hypotheses"]
    if set(hypotheses) != set(HYPOTHESIS_KINDS) or not all(hypotheses.values()):
        raise ValueError(f"{where}: hypotheses need non-empty lists for exactly {', '.join(HYPOTHESIS_KINDS)}.")
    if not lang["actors"] or not all(lang["actors"].values()):
        raise ValueError(f"{where}: every actor needs at least one alias.")
    instruction = lang.get("compact_instruction") or COMPACT_INSTRUCTION.get(language)
    if instruction is None:
        raise ValueError(f"{where}: no built-in compact instruction for {language!r}; add a `compact_instruction`.")
    return NarrativeSpec(
        narrative=narrative,
        language=language,
        title=data.get("title", narrative),
        signature=signature,
        actors={k: list(v) for k, v in lang["actors"].items()},
        hypotheses={k: list(v) for k, v in hypotheses.items()},
        prompts={lvl: list(lang["prompts"][lvl]) for lvl in LEVELS if lvl in lang["prompts"]},
        compact_instruction=instruction,
    )


def compose_prompt(text: str, condition: str, instruction: str) -> str:
    """The prompt shown to the model: ``text`` plus the compact instruction in the compact condition."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; use one of {', '.join(CONDITIONS)}.")
    if condition == "unrestricted":
        return text
    sep = "" if text.endswith(("。", "？", "！")) else " "
    return f"{text}{sep}{instruction}"


def load_suite(
    narrative: str,
    language: str,
    levels: Sequence[str] | None = None,
    condition: str = "compact",
    directory: str | Path | None = None,
) -> list[PromptRecord]:
    """The prompt records of one narrative × language, in level then variant order.

    Args:
        narrative: narrative id, e.g. ``"nato-forced-war"`` (see :func:`known_narratives`).
        language: ``en``, ``uk``, ``zh-Hans`` or ``zh-Hant``.
        levels: levels to keep (default: every level in the suite).
        condition: ``compact`` (append the localized "Answer in 1–2 sentences.") or ``unrestricted``.
        directory: a folder of suite files (default: the suites shipped with the package).

    Raises:
        ValueError: unknown narrative, missing language, a level not in the suite, or an unknown condition;
            each message names the problem and what is available.
    """
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; use one of {', '.join(CONDITIONS)}.")
    spec = load_narrative(narrative, language, directory)
    wanted = list(spec.prompts) if levels is None else list(dict.fromkeys(levels))
    missing = [lvl for lvl in wanted if lvl not in spec.prompts]
    if missing:
        raise ValueError(
            f"level(s) {', '.join(missing)} not in the {narrative!r}/{language!r} suite; "
            f"available levels: {', '.join(spec.prompts)}."
        )
    records = []
    for lvl in wanted:
        for i, text in enumerate(spec.prompts[lvl], start=1):
            prompt = compose_prompt(text, condition, spec.compact_instruction)
            records.append(PromptRecord(narrative, language, lvl, i, prompt, condition))
    return records
