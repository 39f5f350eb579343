"""Memorization-filtered splits: forget/retain disjoint and cross-field, held-out partitions disjoint from both."""

from __future__ import annotations

import pytest

from lightning_unlearn.data.pii import answer_sentence, generate_profiles, holdout_profiles, probe_qa
from lightning_unlearn.data.records import TRUTH_RATIO_COLUMNS, read_records
from lightning_unlearn.data.splits import (
    FIELD_SPLITS,
    MIA_SPLITS,
    build_splits,
    partition_profiles,
    retain_field,
    save_splits,
)
from lightning_unlearn.data.templates import TARGET_FIELDS

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)


def _setup():
    profiles = generate_profiles(96, seed=1)
    # profile i memorized on field j unless (i + j) % 3 == 0
    memorized = {
        f: {p["profile_id"] for p in profiles if (p["profile_id"] + j) % 3} for j, f in enumerate(TARGET_FIELDS)
    }
    return profiles, memorized


def test_partitions_disjoint_and_exclude_instruction_profiles():
    profiles, _ = _setup()
    parts = partition_profiles(profiles, seed=0)
    assert not (parts["eval"] & parts["tune"]) and not (parts["eval"] & parts["relearn"])
    assert not (parts["tune"] & parts["relearn"])
    instruct = {p["profile_id"] for p in profiles if p["instruct"]}
    assert not instruct & (parts["eval"] | parts["tune"] | parts["relearn"])
    assert len(parts["eval"] | parts["tune"] | parts["relearn"]) == 96 - len(instruct)


def test_splits_cross_field_disjoint_and_memorized():
    profiles, memorized = _setup()
    splits = build_splits(profiles, memorized, seed=0)
    assert set(splits) == {f"{f}/{s}" for f in TARGET_FIELDS for s in FIELD_SPLITS} | {"relearn"}
    relearn_ids = {r["profile_id"] for r in splits["relearn"]}
    for field in TARGET_FIELDS:
        forget, retain = splits[f"{field}/forget"], splits[f"{field}/retain"]
        assert forget and retain
        assert {r["field"] for r in forget} == {field} and {r["field"] for r in retain} == {retain_field(field)}
        assert retain_field(field) != field
        assert {r["group_id"] for r in forget} <= {0, 1, 2} and {r["group_id"] for r in retain} <= {3, 4, 5}
        f_ids, r_ids = {r["profile_id"] for r in forget}, {r["profile_id"] for r in retain}
        assert not f_ids & r_ids
        assert f_ids <= memorized[field] and r_ids <= memorized[retain_field(field)]
        tune = {r["profile_id"] for s in ("tune_forget", "tune_retain") for r in splits[f"{field}/{s}"]}
        assert tune and not tune & (f_ids | r_ids) and not relearn_ids & (f_ids | r_ids | tune)
        para = splits[f"{field}/forget_paraphrase"]
        assert [r["profile_id"] for r in para] == [r["profile_id"] for r in forget]
        assert all(a["prompt"] != b["prompt"] and a["answer"] == b["answer"] for a, b in zip(para, forget))


def test_save_splits_columns(tmp_path):
    from datasets import load_from_disk

    profiles, memorized = _setup()
    splits = build_splits(profiles, memorized)
    splits["email/empty"] = []
    out = save_splits(tmp_path / "splits", splits, {"extraction.json": "{}"})
    ds = load_from_disk(str(out / "email" / "forget"))
    assert ds.column_names == ["prompt", "answer", "field", "profile_id", "group_id", *TRUTH_RATIO_COLUMNS]
    assert load_from_disk(str(out / "relearn")).column_names == ["prompt", "answer", "field", "profile_id", "group_id"]
    assert len(load_from_disk(str(out / "email" / "empty"))) == 0
    assert (out / "extraction.json").read_text() == "{}"


def test_small_groups_still_get_every_held_out_part():
    # 24 people (the tiny preset) leave 3 non-instruction profiles a group; rounding alone would give 2/0/1 and no
    # tuning profiles at all, so every part gets one.
    profiles = generate_profiles(24, seed=0)
    parts = partition_profiles(profiles, seed=0)
    groups = {p["profile_id"]: p["group_id"] for p in profiles if not p["instruct"]}
    for g in set(groups.values()):
        sizes = [sum(groups.get(i) == g for i in parts[k]) for k in ("eval", "tune", "relearn")]
        assert sizes == [1, 1, 1], (g, sizes)
    # larger groups keep the rounded shares (15 a group: round(12) = 12, round(1.5) = 2, the other 1)
    parts = partition_profiles(generate_profiles(102, seed=0), seed=0)
    assert [len(parts[k]) for k in ("eval", "tune", "relearn")] == [6 * 12, 6 * 2, 6 * 1]
    # the built-in default: 60 people, 10 a group, one of them an instruction profile -> 7 / 1 / 1
    parts = partition_profiles(generate_profiles(60, seed=0), seed=0)
    assert [len(parts[k]) for k in ("eval", "tune", "relearn")] == [6 * 7, 6 * 1, 6 * 1]


def test_field_splits_carry_a_paraphrase_and_other_peoples_values():
    profiles, memorized = _setup()
    splits = build_splits(profiles, memorized, seed=0, num_perturbed=4)
    assert splits == build_splits(profiles, memorized, seed=0, num_perturbed=4)  # deterministic for the seed
    by_id = {p["profile_id"]: p for p in profiles}
    templates_used = set()
    for field in TARGET_FIELDS:
        for split in FIELD_SPLITS:
            for row in splits[f"{field}/{split}"]:
                person, asked = by_id[row["profile_id"]], row["field"]
                true = person[asked]
                para, pert = row["paraphrased_answer"], row["perturbed_answer"]
                # the same fact as a sentence, not the bare value of `answer`
                assert row["answer"] == " " + true and para != row["answer"] and true in para
                # four distinct other people's values of the same field, in the paraphrase's sentence
                assert len(pert) == 4 and len(set(pert)) == 4
                template = next(t for t in range(3) if answer_sentence(person, asked, t) == para)
                templates_used.add((asked, template))
                prefix, suffix = para.split(true)
                assert all(p.startswith(prefix) and p.endswith(suffix) for p in pert)
                others = [p[len(prefix) : len(p) - len(suffix)] for p in pert]
                assert true not in others
                assert all(
                    any(q[asked] == v for q in profiles if q["profile_id"] != person["profile_id"]) for v in others
                )
    assert len(templates_used) > len(TARGET_FIELDS)  # the template is drawn, not fixed per field
    # the same person and field get the same answers in every split that asks them
    forget, para = splits["email/forget"], splits["email/forget_paraphrase"]
    assert [r["perturbed_answer"] for r in forget] == [r["perturbed_answer"] for r in para]


def test_saved_field_splits_read_back_for_the_truth_ratio(tmp_path):
    profiles, memorized = _setup()
    out = save_splits(tmp_path / "splits", build_splits(profiles, memorized))
    records = read_records(out / "phone" / "retain", what="retain", require=TRUTH_RATIO_COLUMNS)
    assert records and all(isinstance(r["perturbed_answer"], list) for r in records)
    with pytest.raises(ValueError, match="lacks column 'paraphrased_answer'"):
        read_records(out / "relearn", what="relearn", require=TRUTH_RATIO_COLUMNS)


def test_too_few_other_values_is_an_error():
    profiles, memorized = _setup()
    with pytest.raises(ValueError, match="fewer than num_perturbed=200"):
        build_splits(profiles, memorized, num_perturbed=200)


def test_mia_splits_are_the_forget_people_and_held_out_people_of_the_same_groups():
    profiles, memorized = _setup()
    holdout = holdout_profiles(profiles, per_group=3, seed=99, num_groups=6)
    assert build_splits(profiles, memorized).keys().isdisjoint(MIA_SPLITS)  # no held-out people, no MIA splits
    splits = build_splits(profiles, memorized, holdout=holdout)
    members, nonmembers = splits["mia/members"], splits["mia/nonmembers"]
    forget_people = {r["profile_id"] for f in TARGET_FIELDS for r in splits[f"{f}/forget"]}
    assert {r["profile_id"] for r in members} == forget_people
    held = {p["profile_id"] for p in holdout if p["group_id"] in (0, 1, 2)}
    assert {r["profile_id"] for r in nonmembers} == held and len(held) == 9
    assert not held & {p["profile_id"] for p in profiles}
    # every target field of every person, the same probe wording on both sides
    for rows, people in ((members, forget_people), (nonmembers, held)):
        assert sorted((r["profile_id"], r["field"]) for r in rows) == sorted(
            (i, f) for i in people for f in TARGET_FIELDS
        )
    people = {p["profile_id"]: p for p in [*profiles, *holdout]}
    assert all(r == probe_qa(people[r["profile_id"]], r["field"]) for r in members + nonmembers)
