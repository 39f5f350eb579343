"""Synthetic PII generators: deterministic for a seed, templates filled, no placeholder leaks, user JSONL checked."""

from __future__ import annotations

import json
import random
import re

import pytest

from lightning_unlearn.data.neutral import load_neutral_corpus, stdlib_docstring_corpus
from lightning_unlearn.data.pii import (
    PROFILE_FIELDS,
    generate_profiles,
    probe_qa,
    profile_documents,
    profile_qa,
    read_profiles_jsonl,
)
from lightning_unlearn.data.templates import CONTENT_TYPES, QUESTIONS, TARGET_FIELDS, fill
from lightning_unlearn.data.testbed_data import (
    LacunaDataConfig,
    build_tables,
    build_testbed_data,
    load_holdout_profiles,
    load_table,
)

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)

LEAK = re.compile(r"\{[A-Za-z_]*\}")


def test_profiles_do_not_depend_on_the_date(monkeypatch):
    import datetime

    import faker.providers.date_time as faker_dates

    today = generate_profiles(30, seed=3)

    class NextYear(datetime.datetime):  # Faker's "now", 400 days later
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime.now(tz) + datetime.timedelta(days=400)

    monkeypatch.setattr(faker_dates, "datetime", NextYear)
    assert generate_profiles(30, seed=3) == today
    assert all(21 <= int(p["age"]) <= 76 for p in today)


def test_profiles_deterministic_and_complete():
    a, b = generate_profiles(30, seed=3), generate_profiles(30, seed=3)
    assert a == b
    assert a != generate_profiles(30, seed=4)
    for p in a:
        for f in PROFILE_FIELDS:
            assert isinstance(p[f], str) and p[f]
    assert len({(p["first_name"], p["last_name"]) for p in a}) == 30
    assert re.fullmatch(r"\([2-9]\d\d\) [2-9]\d\d-\d{4}", a[0]["phone"])
    assert re.fullmatch(r"[A-Z]{2}-[A-Z]\d{3}-\d{4}-\d{3}", a[0]["drivers_license"])
    assert "@" in a[0]["email"]
    # six groups of five, with round(5 * 0.125) = 1 instruction profile each
    assert sorted(sum(p["group_id"] == g for p in a) for g in range(6)) == [5] * 6
    assert sum(p["instruct"] for p in a) == 6


def test_documents_and_qa_fill_every_template():
    profiles = generate_profiles(12, seed=0)
    rng = random.Random(0)
    for p in profiles:
        docs = profile_documents(p, rng)
        assert [d["content_type"] for d in docs] == list(CONTENT_TYPES)
        name = f"{p['first_name']} {p['last_name']}"
        for d in docs:
            assert name in d["text"] and not LEAK.search(d["text"])
        qa = profile_qa(p, rng, per_field=3)
        for row in qa:
            assert row["prompt"].startswith(f"Question: {name}") and row["prompt"].endswith("\nAnswer:")
            assert not LEAK.search(row["prompt"]) and not LEAK.search(row["answer"])
            assert row["answer"] == " " + p[row["field"]]
            # the asked value never appears in the prompt (continuations are about other attributes)
            assert p[row["field"]] not in row["prompt"]


def test_probe_and_paraphrase_use_disjoint_wordings():
    p = generate_profiles(6, seed=0)[0]
    for field in TARGET_FIELDS:
        seen = probe_qa(p, field)["prompt"]
        para = probe_qa(p, field, paraphrase=True)["prompt"]
        assert seen != para
        assert (
            seen
            == f"Question: {p['first_name']} {p['last_name']}. "
            + fill(
                QUESTIONS[field][0],
                {
                    "pronoun": "her" if p["gender"] == "female" else "his" if p["gender"] == "male" else "their",
                    "subject": f"{p['first_name']} {p['last_name']}",
                },
            )
            + "\nAnswer:"
        )


def test_fill_refuses_missing_value():
    with pytest.raises(KeyError, match="email"):
        fill("reach me at {email}", {})


def test_profile_jsonl_missing_field_names_field_and_line(tmp_path):
    rows = generate_profiles(6, seed=0)
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(json.dumps({k: r[k] for k in PROFILE_FIELDS}) for r in rows))
    loaded = read_profiles_jsonl(good)
    assert [p["group_id"] for p in loaded] == [0, 1, 2, 3, 4, 5]
    del rows[2]["phone"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: profile is missing field 'phone'"):
        read_profiles_jsonl(bad)


def test_profile_jsonl_empty_group(tmp_path):
    rows = generate_profiles(6, seed=0)
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({**{k: r[k] for k in PROFILE_FIELDS}, "group_id": 0}) for r in rows))
    with pytest.raises(ValueError, match="group 1 is empty"):
        read_profiles_jsonl(path)


def test_neutral_corpus_sources(tmp_path):
    a = stdlib_docstring_corpus(max_paragraphs=50)
    assert a == stdlib_docstring_corpus(max_paragraphs=50) and len(a) == 50
    (tmp_path / "x.txt").write_text("short\n\n" + "a long enough paragraph of neutral text. " * 3)
    assert len(load_neutral_corpus(tmp_path)) == 1
    with pytest.raises(FileNotFoundError, match="neutral corpus path .*nope.* does not exist"):
        load_neutral_corpus(tmp_path / "nope")


def test_build_testbed_data_atomic_and_reused(tmp_path):
    cfg = LacunaDataConfig(num_profiles=12, neutral_max_paragraphs=20, instruct_questions=2, utility_paragraphs=4)
    tables = build_tables(cfg)
    assert len(tables["documents"]) == 12 * 5
    # the utility paragraphs are held out of the neutral (training) text: the last 4 of ≥ 20 words
    corpus = stdlib_docstring_corpus(max_paragraphs=20)
    utility = [r["text"] for r in tables["utility"]]
    assert utility == [t for t in corpus if len(t.split()) >= 20][-4:]
    assert [r["text"] for r in tables["neutral"]] == [t for t in corpus if t not in utility]
    assert len(tables["instruct_qa"]) == 6 * 4 * 2
    out = build_testbed_data(tmp_path / "data", cfg, log=lambda *_: None)
    assert load_table(out, "qa").column_names == ["prompt", "answer", "field", "profile_id", "group_id"]
    assert build_testbed_data(tmp_path / "data", cfg, log=lambda *_: None) == out
    with pytest.raises(FileExistsError, match="other settings"):
        build_testbed_data(tmp_path / "data", LacunaDataConfig(num_profiles=18), log=lambda *_: None)
    bad = LacunaDataConfig(num_profiles=12, neutral=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="neutral corpus path"):
        build_testbed_data(tmp_path / "data2", bad, log=lambda *_: None)
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # nothing partial left behind
    with pytest.raises(ValueError, match="too few to hold out utility_paragraphs=30"):
        build_tables(LacunaDataConfig(num_profiles=12, neutral_max_paragraphs=20, utility_paragraphs=30))


def test_neutral_corpus_from_datasets_dir(tmp_path):
    from datasets import Dataset

    Dataset.from_dict({"text": ["x" * 100, "short", "y" * 90]}).save_to_disk(str(tmp_path / "ds"))
    assert load_neutral_corpus(tmp_path / "ds") == ["x" * 100, "y" * 90]
    Dataset.from_dict({"body": ["x" * 100]}).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="no 'text' column"):
        load_neutral_corpus(tmp_path / "bad")


def test_held_out_people_are_written_but_never_trained_on(tmp_path):
    cfg = LacunaDataConfig(num_profiles=12, neutral_max_paragraphs=20, instruct_questions=2, utility_paragraphs=4)
    tables = build_tables(cfg)
    holdout, profiles = tables["holdout_profiles"], tables["profiles"]
    assert sorted(sum(p["group_id"] == g for p in holdout) for g in range(6)) == [7] * 6
    assert not {p["profile_id"] for p in holdout} & {p["profile_id"] for p in profiles}
    names = {f"{p['first_name']} {p['last_name']}" for p in holdout}
    assert len(names) == 42 and not names & {f"{p['first_name']} {p['last_name']}" for p in profiles}
    # no training table mentions a held-out person (names and emails)
    texts = [r["text"] for r in tables["documents"]] + [r["prompt"] + r["answer"] for r in tables["qa"]]
    texts += [r["prompt"] + r["answer"] for r in tables["instruct_qa"]]
    assert not any(p["email"] in t or f"{p['first_name']} {p['last_name']}" in t for p in holdout for t in texts)
    # the testbed's own people do not change with the held-out ones
    without = build_tables(LacunaDataConfig(**{**cfg.__dict__, "holdout_per_group": 0}))
    assert without["profiles"] == profiles and without["holdout_profiles"] == []
    assert build_tables(cfg)["holdout_profiles"] == holdout  # deterministic for the seed
    out = build_testbed_data(tmp_path / "data", cfg, log=lambda *_: None)
    assert load_holdout_profiles(out) == holdout
    out = build_testbed_data(tmp_path / "none", LacunaDataConfig(**{**cfg.__dict__, "holdout_per_group": 0}))
    assert load_holdout_profiles(out) == [] and not (out / "holdout_profiles").exists()
