"""Build the Lacuna testbed's data directory: every table an HF ``datasets`` directory (``save_to_disk``).

Layout of ``out_dir``::

    profiles/      one row per profile (PROFILE_FIELDS + profile_id, group_id, instruct)
    documents/     text, content_type, profile_id, group_id   (five content types per profile)
    qa/            prompt, answer, field, profile_id, group_id (training questions about ``qa_fields``)
    instruct_qa/   the same columns; target fields of the instruction profiles, ``instruct_questions`` each
    neutral/       text                                        (the neutral corpus, less the utility paragraphs)
    utility/       text                                        (held-out general text: no stage trains on it)
    holdout_profiles/  the profiles columns, for people no stage trains on (membership inference's non-members)
    manifest.json  the settings it was built with

The directory is written to a temporary sibling and renamed into place, so a failure leaves nothing behind, and
a directory built with other settings is never silently reused.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from lightning_unlearn.atomic import write_directory_atomically
from lightning_unlearn.data.neutral import load_neutral_corpus
from lightning_unlearn.data.pii import (
    generate_profiles,
    holdout_profiles,
    profile_documents,
    profile_qa,
    qa_pair,
    read_profiles_jsonl,
)
from lightning_unlearn.data.templates import NUM_TRAIN_QUESTIONS, QUESTIONS, TARGET_FIELDS
from lightning_unlearn.errors import ConfigError, MissingPathError, PathExistsError

TABLES = ("profiles", "documents", "qa", "instruct_qa", "neutral", "utility", "holdout_profiles")


@dataclass
class LacunaDataConfig:
    """What the testbed data is made of.

    Args:
        num_profiles: synthetic profiles to generate (ignored with ``profiles_jsonl``). The default, 60 (10 a
            group, one of them an instruction profile), leaves 7 evaluation profiles a group once tuning and
            relearning take theirs (``data/splits.py``), so every field's forget and retain splits hold ≥ 8 pairs
            at a ≥ 40% extraction rate.
        seed: seed of every random choice (Faker, groups, templates).
        num_groups: profile groups (masks); Lacuna uses 6.
        instruct_fraction: share of each group reserved for instruction tuning (Lacuna: 150 of 1,200).
        qa_per_field: training QA pairs per profile and attribute. Several wordings per fact make a model learn
            the fact rather than one string (with 1, a tiny model recites its training QA verbatim but fails on
            the probe wording).
        qa_fields: the attributes that get training QA pairs. Default: the four target fields, the facts the
            probes ask for. The documents state every attribute either way; QA about all ten attributes
            (``QA_FIELDS``) is 2.5x the injection data for facts no probe asks about.
        docs_per_type: documents per profile and content type (each a fresh template/continuation draw).
        instruct_questions: instruction-tuning QA pairs per instruction profile and target field (Lacuna: 10).
        profiles_jsonl: bring your own profiles instead of generating them.
        neutral: neutral corpus source (see :func:`load_neutral_corpus`); ``None`` = stdlib docstrings.
        neutral_max_paragraphs: cap on neutral paragraphs.
        utility_paragraphs: the last paragraphs of ≥ 20 words of the neutral corpus that are held out of every
            training stage (the ``utility`` table): the general text on which utility is measured (the testbed's
            utility check, the localization report's utility CE).
        holdout_per_group: people per group generated like the others but never written to any training table:
            the non-members of membership inference (the filter's ``mia/nonmembers`` split). The default matches the
            7 evaluation profiles a group of the default testbed.
    """

    num_profiles: int = 60
    seed: int = 0
    num_groups: int = 6
    instruct_fraction: float = 0.125
    qa_per_field: int = 4
    qa_fields: tuple[str, ...] = TARGET_FIELDS
    docs_per_type: int = 1
    instruct_questions: int = 10
    profiles_jsonl: str | None = None
    neutral: str | None = None
    neutral_max_paragraphs: int | None = None
    utility_paragraphs: int = 48
    holdout_per_group: int = 7


def build_tables(config: LacunaDataConfig) -> dict[str, list[dict]]:
    """All tables as lists of rows (pure; no files written)."""
    if config.profiles_jsonl is not None:
        profiles = read_profiles_jsonl(config.profiles_jsonl, config.num_groups, config.instruct_fraction)
    else:
        profiles = generate_profiles(config.num_profiles, config.seed, config.num_groups, config.instruct_fraction)
    neutral = load_neutral_corpus(config.neutral, max_paragraphs=config.neutral_max_paragraphs)
    neutral, utility = split_utility(neutral, config.utility_paragraphs)
    rng = random.Random(config.seed + 1)
    documents, qa, instruct_qa = [], [], []
    for p in profiles:
        for _ in range(config.docs_per_type):
            documents.extend(profile_documents(p, rng))
        qa.extend(profile_qa(p, rng, per_field=config.qa_per_field, fields=config.qa_fields))
        if p["instruct"]:
            for field in TARGET_FIELDS:
                for _ in range(config.instruct_questions):
                    question = rng.choice(QUESTIONS[field][:NUM_TRAIN_QUESTIONS])
                    instruct_qa.append(qa_pair(p, field, question, []))
    holdout = holdout_profiles(profiles, config.holdout_per_group, config.seed + 104729, config.num_groups)
    if not any(p["instruct"] for p in profiles):
        raise ConfigError("no profile is reserved for instruction tuning; raise instruct_fraction or set 'instruct'.")
    return {
        "profiles": profiles,
        "documents": documents,
        "qa": qa,
        "instruct_qa": instruct_qa,
        "neutral": [{"text": t} for t in neutral],
        "utility": [{"text": t} for t in utility],
        "holdout_profiles": holdout,
    }


def split_utility(paragraphs: list[str], n: int, min_words: int = 20) -> tuple[list[str], list[str]]:
    """``(training paragraphs, held-out utility paragraphs)``: the last ``n`` paragraphs of ≥ ``min_words`` words
    are held out; the rest, in order, stay for training."""
    if n < 1:
        raise ConfigError(f"utility_paragraphs={n} must be ≥ 1: utility is measured on held-out text.")
    long = [i for i, t in enumerate(paragraphs) if len(t.split()) >= min_words]
    if len(long) < n or len(paragraphs) - n < 1:
        raise ConfigError(
            f"the neutral corpus has {len(long)} paragraphs of ≥ {min_words} words ({len(paragraphs)} in all), too "
            f"few to hold out utility_paragraphs={n} and keep some for training. Lower utility_paragraphs or give a "
            "larger corpus (neutral, neutral_max_paragraphs)."
        )
    held = set(long[-n:])
    return [t for i, t in enumerate(paragraphs) if i not in held], [paragraphs[i] for i in sorted(held)]


def _manifest(config: LacunaDataConfig) -> dict:
    m = json.loads(json.dumps(asdict(config)))  # as read back from manifest.json (tuples become lists)
    if config.profiles_jsonl is not None:
        st = Path(config.profiles_jsonl).stat()
        m["profiles_jsonl_stat"] = [st.st_size, int(st.st_mtime)]
    return m


def build_testbed_data(out_dir: str | os.PathLike, config: LacunaDataConfig, log=print) -> Path:
    """Write the data directory (atomically) unless an identical one exists; returns its path."""
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    out = Path(out_dir)
    manifest = _manifest(config)
    if out.exists():
        found = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else None
        if found == manifest:
            log(f"testbed data: reusing {out} (built with the same settings)")
            return out
        raise PathExistsError(
            f"data directory {str(out)!r} exists but was built with other settings. Delete it or choose another "
            "data_dir."
        )
    tables = build_tables(config)

    def write(tmp: Path) -> None:
        for name in TABLES:
            if tables[name]:  # holdout_per_group = 0 writes no holdout table
                Dataset.from_list(tables[name]).save_to_disk(str(tmp / name))
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))

    write_directory_atomically(out, write)
    log(
        f"testbed data: wrote {out} ({len(tables['profiles'])} profiles, {len(tables['documents'])} documents, "
        f"{len(tables['qa'])} QA, {len(tables['instruct_qa'])} instruction QA, {len(tables['neutral'])} neutral, "
        f"{len(tables['utility'])} held-out utility paragraphs, {len(tables['holdout_profiles'])} held-out people)"
    )
    return out


def load_table(data_dir: str | os.PathLike, name: str):
    """One table of a data directory as a ``datasets.Dataset``."""
    from datasets import load_from_disk

    path = Path(data_dir) / name
    if not path.exists():
        raise MissingPathError(f"testbed table {str(path)!r} does not exist; build the data directory first.")
    return load_from_disk(str(path))


def forget_retain_groups(num_groups: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The testbed's forget and retain groups: the first half of the group ids forget, the rest retain (the paper's
    G_1-G_3 and G_4-G_6 of six; ``(0,)`` and ``(1,)`` of two)."""
    if num_groups < 2:
        raise ConfigError(f"a testbed of {num_groups} group(s) has no forget and retain groups; build at least two.")
    half = num_groups // 2
    return tuple(range(half)), tuple(range(half, num_groups))


def data_num_groups(data_dir: str | Path, from_profiles: bool = True) -> int | None:
    """The data directory's group count: its manifest's ``num_groups``, else (``from_profiles``) one more than its
    profiles' largest ``group_id``; ``None`` when neither says."""
    manifest = Path(data_dir) / "manifest.json"
    if manifest.exists():
        num_groups = json.loads(manifest.read_text()).get("num_groups")
        if num_groups is not None:
            return int(num_groups)
    if not from_profiles:
        return None
    return 1 + max(int(p["group_id"]) for p in load_table(str(data_dir), "profiles"))


def data_forget_retain_groups(data_dir: str | Path) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """:func:`forget_retain_groups` of the data directory's group count (:func:`data_num_groups`)."""
    return forget_retain_groups(data_num_groups(data_dir))


def load_holdout_profiles(data_dir: str | os.PathLike) -> list[dict]:
    """The held-out people of a data directory (``[]`` when it has none: ``holdout_per_group = 0``, or a directory
    built before the table existed)."""
    return list(load_table(data_dir, "holdout_profiles")) if (Path(data_dir) / "holdout_profiles").exists() else []
