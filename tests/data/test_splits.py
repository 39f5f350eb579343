"""Memorization-filtered splits: forget/retain disjoint and cross-field, held-out partitions disjoint from both."""

from __future__ import annotations

import pytest

from lightning_unlearn.data.pii import generate_profiles
from lightning_unlearn.data.splits import FIELD_SPLITS, build_splits, partition_profiles, retain_field, save_splits
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
    assert ds.column_names == ["prompt", "answer", "field", "profile_id", "group_id"]
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
