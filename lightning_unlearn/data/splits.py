"""Memorization-filtered splits of the Lacuna testbed (Section 3.5, Section 4.1).

Only profiles whose PII the injected model actually reveals are kept. Those profiles (instruction profiles
excluded) are divided, per group, into three disjoint partitions: evaluation (P_eval, 80% by default),
hyper-parameter tuning (P_hp, 10%) and relearning (10%, held out for the resurfacing attack), each at least one
profile a group when the group has three. The paper's P_hp and relearning sets are likewise profiles of their own,
never evaluation profiles. Then, for every target field ``f``:

- ``forget``: P_eval profiles of the forget groups (ids 0-2) memorized on ``f``, asking for ``f``;
- ``retain``: P_eval profiles of the retain groups (ids 3-5) memorized on ``retain_field(f)`` ≠ ``f``, asking for
  that field (the paper's cross-field scheme: forget and retain always target different PII types);
- ``forget_paraphrase`` / ``retain_paraphrase``: the same profiles asked with held-out question wordings;
- ``tune_forget`` / ``tune_retain``: the same construction on P_hp.

``relearn`` holds training-wording QA of the relearning profiles for every field they memorized. Every split has
the columns ``prompt, answer, field, profile_id, group_id``; the field splits also have TOFU's truth-ratio columns:

- ``paraphrased_answer``: the same fact as a sentence (one of the field's :data:`ANSWER_TEMPLATES`, chosen per
  profile and field from the seed) instead of the bare value;
- ``perturbed_answer``: ``num_perturbed`` sentences of the same template, each with another person's value of the
  field (distinct, never the true value, drawn from the seed).

With held-out people (``holdout``: generated like the others, never trained on), the membership-inference splits:
``mia/members`` asks every target field of every forget person (a P_eval profile of a forget group in some
``<field>/forget``), ``mia/nonmembers`` every target field of the held-out people of the forget groups, with the
same probe wording, so the two differ only in whether the model saw the person.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

from lightning_unlearn.atomic import write_directory_atomically
from lightning_unlearn.data.pii import answer_sentence, probe_qa, qa_pair
from lightning_unlearn.data.records import TRUTH_RATIO_COLUMNS
from lightning_unlearn.data.templates import ANSWER_TEMPLATES, NUM_TRAIN_QUESTIONS, QUESTIONS, TARGET_FIELDS
from lightning_unlearn.errors import ConfigError

SPLIT_COLUMNS = ("prompt", "answer", "field", "profile_id", "group_id")
FIELD_SPLITS = ("forget", "retain", "forget_paraphrase", "retain_paraphrase", "tune_forget", "tune_retain")
MIA_SPLITS = ("mia/members", "mia/nonmembers")


def retain_field(field: str) -> str:
    """The field the retain set asks about when the forget set asks about ``field`` (next target field)."""
    i = TARGET_FIELDS.index(field)
    return TARGET_FIELDS[(i + 1) % len(TARGET_FIELDS)]


def _part_sizes(n: int, fractions: tuple[float, float, float]) -> list[int]:
    """Profiles per part for a group of ``n``: the rounded shares, then one profile for every part with a positive
    share that rounded to none, taken from the largest part (3 profiles a group would otherwise give 2/1/0 and an
    empty relearning split)."""
    sizes = [min(n, int(round(n * fractions[0])))]
    sizes.append(min(n - sizes[0], int(round(n * fractions[1]))))
    sizes.append(n - sizes[0] - sizes[1])
    for k, share in enumerate(fractions):
        donor = max(range(3), key=lambda j: sizes[j])
        if share > 0 and sizes[k] == 0 and sizes[donor] > 1:
            sizes[donor] -= 1
            sizes[k] += 1
    return sizes


def partition_profiles(
    profiles: Sequence[dict], seed: int = 0, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
) -> dict[str, set[int]]:
    """Split non-instruction profile ids into disjoint ``eval``/``tune``/``relearn`` sets, stratified by group."""
    if abs(sum(fractions) - 1) > 1e-6 or min(fractions) < 0:
        raise ConfigError(f"split fractions {fractions} must be non-negative and sum to 1.")
    rng = random.Random(seed)
    by_group: dict[int, list[int]] = {}
    for p in profiles:
        if not p["instruct"]:
            by_group.setdefault(p["group_id"], []).append(p["profile_id"])
    parts: dict[str, set[int]] = {"eval": set(), "tune": set(), "relearn": set()}
    for g in sorted(by_group):
        ids = sorted(by_group[g])
        rng.shuffle(ids)
        n_eval, n_tune, _ = _part_sizes(len(ids), fractions)
        parts["eval"].update(ids[:n_eval])
        parts["tune"].update(ids[n_eval : n_eval + n_tune])
        parts["relearn"].update(ids[n_eval + n_tune :])
    return parts


def truth_ratio_answers(
    profile: dict, field: str, values: Sequence[str], seed: int = 0, num_perturbed: int = 4
) -> dict[str, str | list[str]]:
    """``{"paraphrased_answer", "perturbed_answer"}`` of one (profile, field): a sentence template of the field drawn
    from ``(seed, profile_id, field)`` states the true value, then ``num_perturbed`` distinct other values of
    ``values`` (everyone's values of the field). Deterministic and independent of the order records are built in."""
    true = str(profile[field])
    others = sorted({str(v) for v in values} - {true})
    if len(others) < num_perturbed:
        raise ConfigError(
            f"field {field!r} has {len(others)} values other than profile {profile['profile_id']}'s, fewer than "
            f"num_perturbed={num_perturbed}; lower num_perturbed or use more profiles."
        )
    rng = random.Random(f"{seed}/{profile['profile_id']}/{field}")  # str seeds hash deterministically
    template = rng.randrange(len(ANSWER_TEMPLATES[field]))
    return {
        "paraphrased_answer": answer_sentence(profile, field, template),
        "perturbed_answer": [answer_sentence(profile, field, template, v) for v in rng.sample(others, num_perturbed)],
    }


def build_splits(
    profiles: Sequence[dict],
    memorized: Mapping[str, set[int]],
    seed: int = 0,
    forget_groups: Sequence[int] = (0, 1, 2),
    retain_groups: Sequence[int] = (3, 4, 5),
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    holdout: Sequence[dict] = (),
    num_perturbed: int = 4,
) -> dict[str, list[dict]]:
    """All splits as rows; keys ``"<field>/<split>"`` for :data:`FIELD_SPLITS`, ``"relearn"`` and, with
    ``holdout``, :data:`MIA_SPLITS`.

    Args:
        profiles: the testbed profiles.
        memorized: ``{field: ids of profiles whose field the model reveals}``.
        seed: seed of the partition and of the truth-ratio answers.
        forget_groups: group ids of the forget set (paper: G_1-G_3 = ids 0-2).
        retain_groups: group ids of the retain set (paper: G_4-G_6 = ids 3-5); disjoint from ``forget_groups``.
        fractions: shares of eval / tune / relearn profiles.
        holdout: people no stage trained on (``holdout_profiles`` of the data directory): the MIA non-members.
        num_perturbed: perturbed answers per field-split record (other people's values; TOFU has 5).
    """
    if set(forget_groups) & set(retain_groups):
        raise ConfigError(f"forget_groups {list(forget_groups)} and retain_groups {list(retain_groups)} overlap.")
    by_id = {p["profile_id"]: p for p in profiles}
    parts = partition_profiles(profiles, seed, fractions)
    values = {f: [p[f] for p in profiles] for f in TARGET_FIELDS}

    def probe(i: int, field: str, paraphrase: bool = False) -> dict:
        row = probe_qa(by_id[i], field, paraphrase=paraphrase)
        return {**row, **truth_ratio_answers(by_id[i], field, values[field], seed, num_perturbed)}

    splits: dict[str, list[dict]] = {}
    for field in TARGET_FIELDS:
        other = retain_field(field)
        for prefix, part in (("", "eval"), ("tune_", "tune")):
            ids = sorted(parts[part])
            forget = [i for i in ids if by_id[i]["group_id"] in forget_groups and i in memorized.get(field, ())]
            retain = [i for i in ids if by_id[i]["group_id"] in retain_groups and i in memorized.get(other, ())]
            splits[f"{field}/{prefix}forget"] = [probe(i, field) for i in forget]
            splits[f"{field}/{prefix}retain"] = [probe(i, other) for i in retain]
            if not prefix:
                splits[f"{field}/forget_paraphrase"] = [probe(i, field, paraphrase=True) for i in forget]
                splits[f"{field}/retain_paraphrase"] = [probe(i, other, paraphrase=True) for i in retain]
    if holdout:
        forget_people = sorted({r["profile_id"] for f in TARGET_FIELDS for r in splits[f"{f}/forget"]})
        nonmembers = [p for p in holdout if p["group_id"] in forget_groups]
        splits["mia/members"] = [probe_qa(by_id[i], f) for i in forget_people for f in TARGET_FIELDS]
        splits["mia/nonmembers"] = [probe_qa(p, f) for p in nonmembers for f in TARGET_FIELDS]
    relearn = []
    for i in sorted(parts["relearn"]):
        for field in TARGET_FIELDS:
            if i in memorized.get(field, ()):
                relearn.extend(qa_pair(by_id[i], field, q, []) for q in QUESTIONS[field][:NUM_TRAIN_QUESTIONS])
    splits["relearn"] = relearn
    return splits


def save_splits(out_dir: str | os.PathLike, splits: Mapping[str, list[dict]], extra_files: Mapping[str, str] = ()):
    """Write every split as a ``datasets`` directory under ``out_dir`` (atomically: temp dir, then rename)."""
    from datasets import Dataset, Features, Value
    from datasets import Sequence as ListOf  # datasets < 4 has no List
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()

    base = {"prompt": Value("string"), "answer": Value("string"), "field": Value("string"),
            "profile_id": Value("int64"), "group_id": Value("int64")}  # fmt: skip
    truth_ratio = {"paraphrased_answer": Value("string"), "perturbed_answer": ListOf(Value("string"))}

    def write(tmp: Path) -> None:
        for name, rows in splits.items():
            # a field split built here has the truth-ratio columns (an empty one too, so every forget/retain split
            # reads alike); rows made elsewhere without them are written without them
            truth_ratio_rows = all(c in r for r in rows for c in TRUTH_RATIO_COLUMNS)
            field_split = name.rsplit("/", 1)[-1] in FIELD_SPLITS and truth_ratio_rows
            columns = SPLIT_COLUMNS + (TRUTH_RATIO_COLUMNS if field_split else ())
            features = Features({**base, **truth_ratio} if len(columns) > len(SPLIT_COLUMNS) else base)
            cols = {c: [r[c] for r in rows] for c in columns}
            Dataset.from_dict(cols, features=features).save_to_disk(str(tmp / name), num_shards=1)
        for name, text in dict(extra_files).items():
            (tmp / name).write_text(text)

    return write_directory_atomically(out_dir, write)
