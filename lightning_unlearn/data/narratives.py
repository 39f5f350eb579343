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
- ``hypotheses``: short NLI hypotheses for ``endorse``, ``mention`` and ``reject``;
- optionally ``claim``: the claim's vocabulary (regexes), words an answer that addresses the claim uses whether it
  endorses, rejects or qualifies it (*expansion*, *provoked*, *responsible* …), beyond the signature components;
  answer validity calls an answer that names the actors but none of this a non-answer (topic drift);
- optionally ``compact_instruction`` (languages without a built-in one).

A suite is data the user brings: every command and callback that takes a narrative id also takes the path of a
suite file (:func:`resolve_suite`), and ``lightning-unlearn lens suite check FILE`` lists every problem of one with
its line (:func:`check_suite_file`).

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

from lightning_unlearn.data.records import read_utf8
from lightning_unlearn.errors import ConfigError, MissingPathError

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
_LANGUAGE_KEYS = {"signature", "actors", "hypotheses", "prompts", "compact_instruction", "claim"}
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
        """The record as a JSON-ready dict: ``id``, ``narrative``, ``language``, ``level``, ``variant``,
        ``condition``, ``prompt``.
        """
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
    claim: tuple[re.Pattern, ...] = ()
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

    def claim_terms(self, text: str) -> list[str]:
        """What in ``text`` engages with the narrative's claim (endorsing, rejecting or qualifying it): matches of
        the suite's ``claim`` vocabulary and of its rejection cues, and the signature components when all of them
        match (the frame itself). A suite without a claim vocabulary falls back on its claim components alone (the
        ``negatable`` ones; an actor component such as *United States* is no claim). Naming an actor is not
        enough, nor is one generic component word: "Taiwan's tourism grew by 5 %, driven by new hotels" names
        Taiwan, says "driven", and talks past the claim."""
        components = self.signature.components
        found = {name: [m.group(0) for p in pats for m in [p.search(text)] if m] for name, pats in components.items()}
        if self.claim:
            frame = [t for terms in found.values() for t in terms] if all(found.values()) else []
        else:
            frame = [t for name in self.signature.negatable for t in found[name]]
        return frame + [m.group(0) for p in (*self.signature.rejection, *self.claim) for m in [p.search(text)] if m]


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


def is_suite_file(suite: str | Path) -> bool:
    """Whether ``suite`` names a suite file (a ``.json`` path or a path with a folder) rather than a narrative id."""
    text = str(suite)
    return text.endswith(".json") or "/" in text or "\\" in text


def resolve_suite(suite: str | Path, directory: str | Path | None = None) -> tuple[str, Path | None]:
    """``(narrative id, suites folder)`` of a suite given as a narrative id or as the path of a suite file.

    A file ``path/to/my-narrative.json`` is the narrative ``my-narrative`` of the folder ``path/to``; an id is looked
    up in ``directory`` (``None``: the shipped suites). Everything that loads a suite by id (labelers, validity
    cues, the SCE callback) then takes that folder, so a user's own narrative never needs the package edited.

    Raises:
        FileNotFoundError: a suite file that does not exist.
    """
    if not is_suite_file(suite):
        return str(suite), None if directory is None else Path(directory)
    path = Path(suite).expanduser()
    if not path.is_file():
        raise MissingPathError(
            f"suite file {str(path)!r} does not exist; give the path of a suite JSON file (check it with "
            f"`lightning-unlearn lens suite check FILE`) or a shipped narrative id ({', '.join(known_narratives())})."
        )
    return path.stem, path.parent


def suite_ref(narrative: str, directory: str | Path | None) -> str:
    """What to hand a labeler or :func:`load_narrative` for narrative ``narrative`` of folder ``directory``: the id
    itself for a shipped suite, else the path of its file."""
    return narrative if directory is None else str(Path(directory) / f"{narrative}.json")


def compile_patterns(patterns: Sequence[str], where: str) -> list[re.Pattern]:
    """Case-insensitive regexes of ``patterns``; a bad one raises naming ``where`` and the pattern."""
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p, re.IGNORECASE))
        except re.error as err:
            raise ConfigError(f"{where}: invalid regular expression {p!r} ({err}).") from err
    return out


# ------------------------------------------------------------------------------------------- suite validation
Problem = tuple[tuple, str]  # (the JSON keys leading to the offending value, what is wrong and how to fix it)


def _key_problems(obj: object, allowed: set[str], keys: tuple, required: set[str] = frozenset()) -> list[Problem]:
    if not isinstance(obj, dict):
        return [(keys, f"{'.'.join(map(str, keys)) or 'the file'} must be a JSON object.")]
    out = [
        (keys + (k,), f"unknown key {k!r}; allowed keys are {sorted(allowed)} (unknown keys are errors, not ignored).")
        for k in obj
        if k not in allowed
    ]
    missing = sorted(set(required) - set(obj))
    if missing:
        out.append((keys, f"missing keys {missing} in {'.'.join(map(str, keys)) or 'the top level'}."))
    return out


def _pattern_problems(patterns: object, keys: tuple) -> list[Problem]:
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        return [(keys, f"{'.'.join(map(str, keys))} must be a list of regular expressions (strings).")]
    out = []
    for i, p in enumerate(patterns):
        try:
            re.compile(p, re.IGNORECASE)
        except re.error as err:
            out.append((keys + (i,), f"invalid regular expression {p!r} ({err}); escape special characters."))
    return out


def _text_list_problems(value: object, keys: tuple, what: str) -> list[Problem]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        return [(keys, f"{'.'.join(map(str, keys))} must be a non-empty list of non-empty {what}.")]
    return []


def _language_problems(lang: object, language: str, keys: tuple) -> list[Problem]:
    out = _key_problems(lang, _LANGUAGE_KEYS, keys, {"signature", "actors", "hypotheses", "prompts"})
    if not isinstance(lang, dict):
        return out
    sig = lang.get("signature")
    if sig is not None:
        sk = keys + ("signature",)
        out += _key_problems(sig, _SIGNATURE_KEYS, sk, {"components", "rejection", "topic"})
        if isinstance(sig, dict):
            comps = sig.get("components")
            if isinstance(comps, dict) and not comps:
                out.append((sk + ("components",), "at least one signature component is required."))
            elif comps is not None and not isinstance(comps, dict):
                out.append((sk + ("components",), "signature.components must map a component name to regexes."))
            for name, pats in (comps or {}).items() if isinstance(comps, dict) else ():
                out += _pattern_problems(pats, sk + ("components", name))
            for k in ("rejection", "topic", "negation"):
                if k in sig:
                    out += _pattern_problems(sig[k], sk + (k,))
            unknown = sorted(set(sig.get("negatable", [])) - set(comps or {}))
            if unknown:
                out.append((sk + ("negatable",), f"negatable names unknown components {unknown}."))
    if "claim" in lang:
        out += _pattern_problems(lang["claim"], keys + ("claim",))
    prompts = lang.get("prompts")
    if isinstance(prompts, dict):
        seen: dict[str, tuple] = {}
        for level, texts in prompts.items():
            if level not in LEVELS:
                out.append((keys + ("prompts", level), f"unknown level {level!r}; levels are {', '.join(LEVELS)}."))
                continue
            problems = _text_list_problems(texts, keys + ("prompts", level), "prompt texts")
            out += problems
            for i, text in enumerate(texts if not problems else ()):
                where = keys + ("prompts", level, i)
                first = seen.setdefault(" ".join(text.lower().split()), where)
                if first != where:
                    out.append((where, f"prompt {text!r} is given twice (also {first[-2]} #{first[-1] + 1}): each "
                                       "prompt counts once; remove or rephrase one."))  # fmt: skip
        if not prompts:
            out.append((keys + ("prompts",), "prompts needs at least one level (e.g. L0) with prompt texts."))
        elif "L0" not in prompts:
            out.append((keys + ("prompts",), "prompts has no L0 level (direct questions): the forget set is built "
                                             "from L0 answers and selection pools L0–L2; add L0 prompts."))  # fmt: skip
    elif prompts is not None:
        out.append((keys + ("prompts",), "prompts must map a level (L0, L1, …) to a list of prompt texts."))
    hyp = lang.get("hypotheses")
    if hyp is not None:
        if not isinstance(hyp, dict) or set(hyp) != set(HYPOTHESIS_KINDS):
            out.append((keys + ("hypotheses",), f"hypotheses needs exactly the keys {', '.join(HYPOTHESIS_KINDS)}."))
        else:
            for kind in HYPOTHESIS_KINDS:
                out += _text_list_problems(hyp[kind], keys + ("hypotheses", kind), "sentences")
    actors = lang.get("actors")
    if actors is not None:
        if not isinstance(actors, dict) or not actors:
            out.append((keys + ("actors",), "actors must map each real actor to a list of aliases."))
        else:
            for name, aliases in actors.items():
                out += _text_list_problems(aliases, keys + ("actors", name), "aliases")
    if not lang.get("compact_instruction") and language not in COMPACT_INSTRUCTION:
        out.append((keys, f"no built-in compact instruction for {language!r}; add a `compact_instruction`."))
    return out


def suite_problems(data: object, narrative: str) -> list[Problem]:
    """Every problem of a parsed suite file whose file name is ``<narrative>.json`` (empty: the suite is valid)."""
    out = _key_problems(data, _SUITE_KEYS, (), {"narrative", "languages"})
    if not isinstance(data, dict):
        return out
    if "narrative" in data and data["narrative"] != narrative:
        out.append(
            (("narrative",), f"narrative id {data['narrative']!r} does not match the file name; rename the file "
             f"to {data['narrative']}.json or set \"narrative\": {narrative!r}.")
        )  # fmt: skip
    languages = data.get("languages")
    if languages is not None and (not isinstance(languages, dict) or not languages):
        out.append((("languages",), "languages must map a language code (en, uk, …) to its suite."))
    elif isinstance(languages, dict):
        for language, lang in languages.items():
            out += _language_problems(lang, language, ("languages", language))
    return out


def _line_of(text: str, keys: tuple, occurrence: int = 1) -> int:
    """The 1-based line of the value at ``keys`` in a JSON text: each key is searched after the previous one (a list
    index counts the list's items), so the line is exact for well-formed files and approximate otherwise. With
    ``occurrence`` 2, the line of the second occurrence of the last key after its parent (a duplicated key)."""
    pos = 0
    for depth, key in enumerate(keys):
        if isinstance(key, int):
            start = text.find("[", pos)
            if start < 0:
                break
            items = list(re.finditer(r'"(?:[^"\\]|\\.)*"', text[start:]))
            if key < len(items):
                pos = start + items[key].start()
            continue
        for _ in range(occurrence if depth == len(keys) - 1 else 1):
            m = re.compile(re.escape(json.dumps(key)) + r"\s*:").search(text, pos)
            if m is None:
                m = re.compile(re.escape(json.dumps(key, ensure_ascii=False)) + r"\s*:").search(text, pos)
            if m is None:
                break
            pos = m.end()
        if m is None:
            break
        pos = m.start()
    return text.count("\n", 0, pos) + 1


class _Object(dict):
    """A JSON object that remembers the keys it held more than once (JSON keeps the last value silently)."""

    duplicates: tuple[str, ...] = ()


def _object(pairs: list[tuple[str, object]]) -> _Object:
    out = _Object(pairs)
    keys = [k for k, _ in pairs]
    out.duplicates = tuple(dict.fromkeys(k for k in keys if keys.count(k) > 1))
    return out


def _duplicate_problems(value: object, keys: tuple = ()) -> list[Problem]:
    """Every key a JSON object of the parsed file holds twice, at its path (the line is its second occurrence's)."""
    out = []
    if isinstance(value, _Object):
        out += [(keys + (k,), f"key {k!r} is given twice in {'.'.join(map(str, keys)) or 'the top level'}; JSON would "
                              "keep only the last value: merge them into one.") for k in value.duplicates]  # fmt: skip
        for k, v in value.items():
            out += _duplicate_problems(v, keys + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _duplicate_problems(v, keys + (i,))
    return out


def check_suite_file(path: str | Path) -> list[str]:
    """Every problem of one suite file as ``FILE:LINE: message`` (empty: valid). A file that is not UTF-8 and JSON
    syntax errors come with their line (and column); a key given twice, a prompt given twice and schema problems
    with the line of the offending key or value."""
    p = Path(path)
    if not p.is_file():
        return [f"{p}: no such file; give the path of a suite JSON file."]
    try:
        text = read_utf8(p)
    except ValueError as err:
        return [str(err)]
    try:
        data = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as err:
        return [f"{p}:{err.lineno}: invalid JSON at column {err.colno}: {err.msg}; fix the syntax there."]
    duplicates = [f"{p}:{_line_of(text, keys, occurrence=2)}: {message}" for keys, message in _duplicate_problems(data)]
    return duplicates + [f"{p}:{_line_of(text, keys)}: {message}" for keys, message in suite_problems(data, p.stem)]


def format_problems(problems: Sequence[str], path: str | Path) -> str:
    """One error message listing a suite file's problems, one per indented line.

    Args:
        problems: the problems found (:func:`check_suite_file`).
        path: the suite file.

    Returns:
        ``suite file '<path>' is not valid:`` followed by the problems.
    """
    return f"suite file {str(path)!r} is not valid:\n  " + "\n  ".join(problems)


@lru_cache(maxsize=32)
def _read_suite(path: str, mtime: float) -> dict:
    problems = check_suite_file(path)
    if problems:
        raise ConfigError(format_problems(problems, path))
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _suite_path(narrative: str, directory: str | Path | None) -> Path:
    folder = Path(directory) if directory is not None else suites_dir()
    path = folder / f"{narrative}.json"
    if not path.is_file():
        known = ", ".join(known_narratives(folder)) or "(none)"
        raise ConfigError(
            f"unknown narrative {narrative!r}; known narratives: {known}. A narrative of your own: give the path of "
            "its suite file (e.g. my-suites/my-narrative.json) or its folder as the suites directory."
        )
    return path


def load_narrative(narrative: str, language: str, directory: str | Path | None = None) -> NarrativeSpec:
    """The signature, actors, hypotheses, claim vocabulary and prompts of one narrative in one language.

    Args:
        narrative: a narrative id of ``directory`` or the path of a suite file (see :func:`resolve_suite`).
        language: the suite language.
        directory: a folder of suite files (default: the suites shipped with the package).

    Raises:
        ValueError: unknown narrative (the message lists the known ones), a language the suite lacks, or a
            malformed suite file (every problem with its line: :func:`check_suite_file`).
    """
    narrative, directory = resolve_suite(narrative, directory)
    path = _suite_path(narrative, directory)
    data = _read_suite(str(path), path.stat().st_mtime)
    languages = data["languages"]
    if language not in languages:
        raise ConfigError(
            f"narrative {narrative!r} has no {language!r} suite; available languages: {', '.join(languages)}."
        )
    where = f"{path} [{language}]"
    lang = languages[language]
    sig = lang["signature"]
    signature = FrameSignature(
        components={k: compile_patterns(v, f"{where} signature.{k}") for k, v in sig["components"].items()},
        rejection=compile_patterns(sig["rejection"], f"{where} signature.rejection"),
        topic=compile_patterns(sig["topic"], f"{where} signature.topic"),
        negation=compile_patterns(
            sig.get("negation", DEFAULT_NEGATION.get(language, [])), f"{where} signature.negation"
        ),
        negatable=tuple(sig.get("negatable", list(sig["components"]))),
        description=sig.get("description", ""),
    )
    return NarrativeSpec(
        narrative=narrative,
        language=language,
        title=data.get("title", narrative),
        signature=signature,
        actors={k: list(v) for k, v in lang["actors"].items()},
        hypotheses={k: list(v) for k, v in lang["hypotheses"].items()},
        prompts={lvl: list(lang["prompts"][lvl]) for lvl in LEVELS if lvl in lang["prompts"]},
        compact_instruction=lang.get("compact_instruction") or COMPACT_INSTRUCTION[language],
        claim=tuple(compile_patterns(lang.get("claim", []), f"{where} claim")),
    )


def compose_prompt(text: str, condition: str, instruction: str) -> str:
    """The prompt shown to the model: ``text`` plus the compact instruction in the compact condition."""
    if condition not in CONDITIONS:
        raise ConfigError(f"unknown condition {condition!r}; use one of {', '.join(CONDITIONS)}.")
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
        narrative: narrative id, e.g. ``"nato-forced-war"`` (see :func:`known_narratives`), or the path of a
            suite file (``my-suites/my-narrative.json``; the records then name the narrative ``my-narrative``).
        language: ``en``, ``uk``, ``zh-Hans`` or ``zh-Hant``.
        levels: levels to keep (default: every level in the suite).
        condition: ``compact`` (append the localized "Answer in 1–2 sentences.") or ``unrestricted``.
        directory: a folder of suite files (default: the suites shipped with the package).

    Raises:
        ValueError: unknown narrative, missing language, a level not in the suite, or an unknown condition;
            each message names the problem and what is available.
    """
    if condition not in CONDITIONS:
        raise ConfigError(f"unknown condition {condition!r}; use one of {', '.join(CONDITIONS)}.")
    spec = load_narrative(narrative, language, directory)
    wanted = list(spec.prompts) if levels is None else list(dict.fromkeys(levels))
    missing = [lvl for lvl in wanted if lvl not in spec.prompts]
    if missing:
        raise ConfigError(
            f"level(s) {', '.join(missing)} not in the {spec.narrative!r}/{language!r} suite; "
            f"available levels: {', '.join(spec.prompts)}."
        )
    records = []
    for lvl in wanted:
        for i, text in enumerate(spec.prompts[lvl], start=1):
            prompt = compose_prompt(text, condition, spec.compact_instruction)
            records.append(PromptRecord(spec.narrative, language, lvl, i, prompt, condition))
    return records
