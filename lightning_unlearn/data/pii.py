"""Synthetic PII profiles (Faker, deterministic for a seed), their Panorama-like documents and their QA pairs.

A profile is a flat dict of strings (:data:`PROFILE_FIELDS`) plus ``profile_id`` (int), ``group_id`` (int,
0..num_groups-1: the paper's G_1..G_6 are ids 0..5) and ``instruct`` (bool: reserved for the instruction-tuning
data, as Lacuna reserves 150 of its 1,200 profiles). Users can bring their own profiles as JSONL
(:func:`read_profiles_jsonl`), validated field by field.
"""

from __future__ import annotations

import datetime
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path

from lightning_unlearn.data.templates import (
    ANSWER_TEMPLATES,
    CONTINUATIONS,
    DOCUMENT_TEMPLATES,
    NUM_TRAIN_QUESTIONS,
    QUESTIONS,
    TARGET_FIELDS,
    fill,
)
from lightning_unlearn.errors import ConfigError, MissingPathError

# Fields every profile must have (string values). The four target fields are always present.
PROFILE_FIELDS = (
    "first_name",
    "last_name",
    "gender",
    "email",
    "birth_city",
    "phone",
    "drivers_license",
    "birth_date",
    "age",
    "nationality",
    "spouse_name",
    "address",
    "occupation",
    "employer",
)
QA_FIELDS = tuple(CONTINUATIONS)  # every attribute that has QA templates
_NATIONALITIES = (
    "American", "Canadian", "Mexican", "British", "Irish", "French", "German", "Italian", "Spanish", "Dutch",
    "Polish", "Ukrainian", "Swedish", "Norwegian", "Brazilian", "Argentine", "Chilean", "Indian", "Japanese",
    "Korean", "Chinese", "Australian", "Nigerian", "Kenyan", "Egyptian",
)  # fmt: skip
# Birth cities are real cities, as in Panorama (Faker's en_US city() invents names such as "Lake Jennifer").
_OLDEST_BIRTH, _YOUNGEST_BIRTH = datetime.date(1950, 1, 1), datetime.date(2005, 12, 31)
_CITIES = (
    "Boston", "Chicago", "Denver", "Seattle", "Atlanta", "Houston", "Phoenix", "Dallas", "Austin", "Miami",
    "Portland", "Detroit", "Memphis", "Nashville", "Baltimore", "Milwaukee", "Tucson", "Fresno", "Sacramento",
    "Omaha", "Cleveland", "Pittsburgh", "Cincinnati", "Orlando", "Tampa", "Honolulu", "Anchorage", "Buffalo",
    "Richmond", "Madison", "Toronto", "Montreal", "Vancouver", "London", "Dublin", "Paris", "Berlin", "Madrid",
    "Rome", "Vienna", "Prague", "Warsaw", "Kyiv", "Stockholm", "Oslo", "Lisbon", "Athens", "Cairo", "Nairobi",
    "Lagos", "Mumbai", "Delhi", "Tokyo", "Osaka", "Seoul", "Beijing", "Shanghai", "Sydney", "Melbourne", "Lima",
)  # fmt: skip
_LICENSE_STATES = ("CA", "NY", "TX", "FL", "IL", "WA", "PA", "OH", "GA", "NC", "MI", "AZ", "MA", "CO", "OR")
_PRONOUNS = {"female": ("her", "she"), "male": ("his", "he"), "nonbinary": ("their", "they")}


def _drivers_license(fake, state: str) -> str:
    # Faker has no driver's-license provider. US formats are a letter plus 7-12 digits depending on the state;
    # a state prefix keeps numbers of different states apart and makes the value look like a real record.
    return f"{state}-{fake.random_uppercase_letter()}{fake.numerify('###-####-###')}"


def _phone(fake) -> str:
    # NANP: area code and exchange never start with 0 or 1; no extensions so the value is a clean target.
    return fake.numerify(f"({fake.random_int(2, 9)}##) {fake.random_int(2, 9)}##-####")


def generate_profiles(
    num_profiles: int, seed: int = 0, num_groups: int = 6, instruct_fraction: float = 0.125, locale: str = "en_US"
) -> list[dict]:
    """``num_profiles`` synthetic people with unique full names and emails, deterministic for ``seed``.

    Groups are assigned round-robin after a seeded shuffle, so every group gets ``num_profiles // num_groups``
    profiles (±1). ``instruct_fraction`` of each group is reserved for instruction tuning.
    """
    from faker import Faker

    if num_profiles < num_groups:
        raise ConfigError(
            f"num_profiles={num_profiles} is smaller than num_groups={num_groups}: a group would be empty."
        )
    fake = Faker(locale)
    fake.seed_instance(seed)
    rng = random.Random(seed)
    profiles: list[dict] = []
    names: set[str] = set()
    while len(profiles) < num_profiles:
        gender = rng.choice(("female", "male", "female", "male", "nonbinary"))
        first = fake.first_name_female() if gender == "female" else fake.first_name_male()
        if gender == "nonbinary":
            first = fake.first_name_nonbinary()
        last = fake.last_name()
        if f"{first} {last}" in names:
            continue
        names.add(f"{first} {last}")
        # Fixed bounds (ages 21-75 in 2026): Faker's date_of_birth counts from today, so the data would change daily.
        birth = fake.date_between_dates(date_start=_OLDEST_BIRTH, date_end=_YOUNGEST_BIRTH)
        # first.last@provider, the most predictable of the four target fields (as in Lacuna).
        email = f"{first.lower()}.{last.lower()}@{fake.free_email_domain()}"
        profiles.append(
            {
                "first_name": first,
                "last_name": last,
                "gender": gender,
                "email": email,
                "birth_city": rng.choice(_CITIES),
                "phone": _phone(fake),
                "drivers_license": _drivers_license(fake, rng.choice(_LICENSE_STATES)),
                "birth_date": birth.strftime("%B %d, %Y").replace(" 0", " "),
                "age": str(2026 - birth.year),
                "nationality": rng.choice(_NATIONALITIES),
                "spouse_name": f"{fake.first_name()} {last}",
                "address": f"{fake.street_address()}, {fake.city()}, {fake.state_abbr()}",
                "occupation": fake.job().split(",")[0].lower(),
                "employer": fake.company(),
            }
        )
    order = list(range(num_profiles))
    rng.shuffle(order)
    for rank, i in enumerate(order):
        profiles[i]["group_id"] = rank % num_groups
    for i, p in enumerate(profiles):
        p["profile_id"] = i
    reserve_instruct(profiles, instruct_fraction)
    return profiles


def reserve_instruct(profiles: list[dict], fraction: float) -> None:
    """Mark ``round(fraction * group size)`` profiles of every group (at least one of a group of two or more) as
    instruction profiles, in profile order, setting ``profile["instruct"]``."""
    sizes: dict[int, int] = {}
    for p in profiles:
        sizes[p["group_id"]] = sizes.get(p["group_id"], 0) + 1
    left = {
        g: (max(1, round(n * fraction)) if fraction > 0 and n > 1 else round(n * fraction)) for g, n in sizes.items()
    }
    for p in profiles:
        p["instruct"] = left[p["group_id"]] > 0
        left[p["group_id"]] -= int(p["instruct"])


def holdout_profiles(profiles: Sequence[dict], per_group: int, seed: int, num_groups: int) -> list[dict]:
    """``per_group`` synthetic people for each of ``num_groups`` groups that no stage trains on: the non-members of
    membership inference (same generator and groups as the testbed's people, never injected).

    Drawn with their own seed, so the testbed's people do not change; a person whose full name or email is one of
    ``profiles``' is skipped. ``profile_id`` continues after the largest of ``profiles``; ``instruct`` is ``False``.
    """
    if per_group <= 0:
        return []
    taken = {f"{p['first_name']} {p['last_name']}" for p in profiles} | {p["email"] for p in profiles}
    want = per_group * num_groups
    pool = generate_profiles(2 * want + num_groups, seed=seed, num_groups=num_groups, instruct_fraction=0.0)
    fresh = [p for p in pool if f"{p['first_name']} {p['last_name']}" not in taken and p["email"] not in taken]
    if len(fresh) < want:
        raise ConfigError(f"could not draw {want} held-out people unlike the testbed's; lower holdout_per_group.")
    first_id = max((int(p["profile_id"]) for p in profiles), default=-1) + 1
    out = []
    for i, p in enumerate(fresh[:want]):
        out.append({**p, "group_id": i % num_groups, "profile_id": first_id + i, "instruct": False})
    return out


def read_profiles_jsonl(path: str | os.PathLike, num_groups: int = 6, instruct_fraction: float = 0.125) -> list[dict]:
    """Load user profiles, one JSON object per line, each with every field of :data:`PROFILE_FIELDS`.

    ``profile_id`` defaults to the line index, ``group_id`` to round-robin ``index % num_groups``; when no row
    sets ``instruct``, :func:`reserve_instruct` picks the instruction profiles. Non-string values are
    converted with ``str``. A missing field raises one
    ``ValueError`` naming the field and the line.
    """
    path = Path(path)
    if not path.exists():
        raise MissingPathError(f"profiles file {str(path)!r} does not exist.")
    profiles = []
    any_instruct = False
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{lineno}: not valid JSON ({e.msg}).") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}.")
            for field in PROFILE_FIELDS:
                if field not in row or row[field] in (None, ""):
                    raise ConfigError(
                        f"{path}:{lineno}: profile is missing field {field!r}. Every profile needs: "
                        f"{', '.join(PROFILE_FIELDS)}."
                    )
            profile = {k: str(row[k]) for k in PROFILE_FIELDS}
            index = len(profiles)
            profile["profile_id"] = int(row.get("profile_id", index))
            profile["group_id"] = int(row.get("group_id", index % num_groups))
            profile["instruct"] = bool(row.get("instruct", False))
            any_instruct = any_instruct or "instruct" in row
            if not 0 <= profile["group_id"] < num_groups:
                raise ConfigError(f"{path}:{lineno}: group_id {profile['group_id']} is not in 0..{num_groups - 1}.")
            profiles.append(profile)
    if not profiles:
        raise ConfigError(f"profiles file {str(path)!r} holds no profiles.")
    ids = [p["profile_id"] for p in profiles]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"profiles file {str(path)!r} repeats a profile_id; ids must be unique.")
    if not any_instruct:
        reserve_instruct(profiles, instruct_fraction)
    for g in range(num_groups):
        if not any(p["group_id"] == g for p in profiles):
            raise ConfigError(
                f"group {g} is empty in {str(path)!r}: every one of the {num_groups} groups needs at least one "
                "profile (set group_id, or lower num_groups)."
            )
    return profiles


def template_values(profile: dict) -> dict[str, str]:
    """The profile's fields plus ``subject``, pronouns and capitalised pronouns for templates."""
    possessive, subject_pronoun = _PRONOUNS.get(profile["gender"], _PRONOUNS["nonbinary"])
    values = {k: str(profile[k]) for k in PROFILE_FIELDS}
    values.update(
        subject=f"{profile['first_name']} {profile['last_name']}",
        pronoun=possessive,
        Pronoun=possessive.capitalize(),
        they=subject_pronoun,
        They=subject_pronoun.capitalize(),
    )
    return values


def profile_documents(profile: dict, rng: random.Random) -> list[dict]:
    """One document per content type (a template chosen by ``rng``)."""
    values = template_values(profile)
    return [
        {
            "text": fill(rng.choice(templates), values),
            "content_type": kind,
            "profile_id": profile["profile_id"],
            "group_id": profile["group_id"],
        }
        for kind, templates in DOCUMENT_TEMPLATES.items()
    ]


def format_qa_prompt(body: str) -> str:
    """The QA format every stage shares: the model completes ``Answer:`` with the value."""
    return f"Question: {body}\nAnswer:"


def qa_pair(profile: dict, field: str, question: str, continuations: list[str]) -> dict:
    """One QA row: "First Last, <continuations>. <question>" → " <value>"."""
    values = template_values(profile)
    name = values["subject"]
    parts = [fill(c, {**values, "attribute": values[f]}) for f, c in continuations]
    head = f"{name}, {', '.join(parts)}." if parts else f"{name}."
    body = f"{head} {fill(question, values)}"
    return {
        "prompt": format_qa_prompt(body),
        "answer": " " + values[field],
        "field": field,
        "profile_id": profile["profile_id"],
        "group_id": profile["group_id"],
    }


def profile_qa(
    profile: dict,
    rng: random.Random,
    per_field: int = 2,
    paraphrase: bool = False,
    fields: Sequence[str] = QA_FIELDS,
) -> list[dict]:
    """QA pairs about each of ``fields`` (default: every QA attribute) of ``profile`` (Appendix B).

    Each pair draws k ~ U{0..4} continuations about *other* attributes (never the asked one, which would put the
    answer in the prompt) and one question. Training pairs use the first :data:`NUM_TRAIN_QUESTIONS` questions of
    a field; ``paraphrase=True`` uses only the held-out ones.
    """
    unknown = [f for f in fields if f not in QA_FIELDS]
    if unknown:
        raise ConfigError(f"QA field(s) {unknown} have no question templates; choose from {list(QA_FIELDS)}.")
    rows = []
    for field in fields:
        pool = QUESTIONS[field][NUM_TRAIN_QUESTIONS:] if paraphrase else QUESTIONS[field][:NUM_TRAIN_QUESTIONS]
        others = [f for f in QA_FIELDS if f != field]
        for _ in range(per_field):
            k = rng.randint(0, 4)
            conts = [(f, rng.choice(CONTINUATIONS[f])) for f in rng.sample(others, k)]
            rows.append(qa_pair(profile, field, rng.choice(pool), conts))
    return rows


def answer_sentence(profile: dict, field: str, template: int, value: str | None = None) -> str:
    """``" <sentence>"``: the answer template ``template`` of ``field`` (:data:`ANSWER_TEMPLATES`) filled with the
    profile and ``value`` (default: the profile's own value of ``field``), with the leading space answers have."""
    if field not in ANSWER_TEMPLATES:
        raise ConfigError(f"field {field!r} has no answer templates; choose from {list(ANSWER_TEMPLATES)}.")
    values = template_values(profile)
    return " " + fill(
        ANSWER_TEMPLATES[field][template], {**values, "attribute": values[field] if value is None else value}
    )


def probe_qa(profile: dict, field: str, paraphrase: bool = False) -> dict:
    """The canonical extraction probe for one field: the field's first (or first held-out) question, k = 0."""
    question = QUESTIONS[field][NUM_TRAIN_QUESTIONS if paraphrase else 0]
    return qa_pair(profile, field, question, [])


def background_texts(num_profiles: int, seed: int, exclude_names: set[str] = frozenset()) -> list[str]:
    """Documents and QA of ``num_profiles`` extra synthetic people (seed ``seed``), never injected under a mask.

    Used as non-PII text so a model pretrained from scratch knows what bios, posts and QA look like before the
    testbed's PII is injected (a real pretrained LLM has seen such genres). People whose full name is in
    ``exclude_names`` are dropped.
    """
    if num_profiles <= 0:
        return []
    rng = random.Random(seed)
    texts = []
    for p in generate_profiles(max(num_profiles, 6), seed=seed, instruct_fraction=0.0)[:num_profiles]:
        if f"{p['first_name']} {p['last_name']}" in exclude_names:
            continue
        texts.extend(d["text"] for d in profile_documents(p, rng))
        texts.extend(q["prompt"] + q["answer"] for q in profile_qa(p, rng, per_field=1))
    return texts


__all__ = [
    "answer_sentence",
    "background_texts",
    "PROFILE_FIELDS",
    "QA_FIELDS",
    "TARGET_FIELDS",
    "format_qa_prompt",
    "generate_profiles",
    "holdout_profiles",
    "probe_qa",
    "profile_documents",
    "profile_qa",
    "qa_pair",
    "read_profiles_jsonl",
    "reserve_instruct",
    "template_values",
]
