"""ForgetRetainDataModule: the three sources, paired batches, and errors a user can cause."""

import json

import pytest
from datasets import Dataset, DatasetDict

from lightning_unlearn.data.records import read_records
from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.losses import IGNORE_INDEX

FORGET = [{"prompt": f"Q{i}: email of person {i}? ", "answer": f"p{i}@mail.org"} for i in range(5)]
RETAIN = [{"prompt": f"R{i}: city of person {i}? ", "answer": f"City{i}"} for i in range(9)]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _dm(tiny_dir, tmp_path, forget, retain, **kwargs):
    f, r = _jsonl(tmp_path / "f.jsonl", forget), _jsonl(tmp_path / "r.jsonl", retain)
    return ForgetRetainDataModule(str(tiny_dir), f, r, **kwargs)


def test_jsonl_pairs_become_forget_retain_batches(tiny_dir, tmp_path):
    dm = _dm(tiny_dir, tmp_path, FORGET, RETAIN, batch_size=2, retain_batch_size=3)
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = [b for b, _, _ in iter(loader)]
    assert len(batches) == 3  # one pass over the 5 forget pairs (retain is longer: it is cut, not cycled)
    first = batches[0]
    assert set(first) == {"forget", "retain"}
    assert first["forget"]["input_ids"].shape[0] == 2 and first["retain"]["input_ids"].shape[0] == 3
    labels = first["forget"]["labels"][0]
    # prompt tokens are masked, answer tokens are labels
    assert labels[1] == IGNORE_INDEX and (labels != IGNORE_INDEX).sum() > 0
    forget_ids, retain_ids = dm.val_dataloader()
    assert len(forget_ids.dataset) == 5 and len(retain_ids.dataset) == 9


def test_short_retain_set_is_cycled(tiny_dir, tmp_path):
    dm = _dm(tiny_dir, tmp_path, RETAIN, FORGET[:2], batch_size=2)
    dm.setup("fit")
    assert len([b for b, _, _ in iter(dm.train_dataloader())]) == 5  # 9 forget pairs in batches of 2


def test_random_answers_pair_forget_prompts_with_retain_answers(tiny_dir, tmp_path):
    dm = _dm(tiny_dir, tmp_path, FORGET, RETAIN, random_answers=True, seed=3)
    dm.setup("fit")
    tok = dm.tokenizer
    retain_answers = {r["answer"] for r in RETAIN}
    for row, forget in zip(dm.mismatch.rows, FORGET):
        answer = tok.decode([t for t in row["labels"] if t != IGNORE_INDEX], skip_special_tokens=True)
        assert answer.strip() in retain_answers
        assert tok.decode(row["input_ids"], skip_special_tokens=True).startswith(forget["prompt"].strip())
    assert "mismatch" in next(iter(dm.train_dataloader()))[0]


def test_datasets_directory_and_testbed_splits(tiny_dir, tmp_path):
    rows = [dict(r, field="email", profile_id=i, group_id=i % 3) for i, r in enumerate(FORGET)]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "plain"))
    assert read_records(tmp_path / "plain")[0]["group_id"] == 0
    # Testbed layout: <splits>/<field>/<split>/ datasets directories.
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "splits" / "email" / "forget"))
    retain_rows = [dict(r, field="phone", profile_id=100 + i, group_id=3 + i % 3) for i, r in enumerate(RETAIN)]
    Dataset.from_list(retain_rows).save_to_disk(str(tmp_path / "splits" / "email" / "retain"))
    dm = ForgetRetainDataModule(str(tiny_dir), str(tmp_path / "splits" / "email"), batch_size=5)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))[0]
    assert sorted(batch["forget"]["group_ids"].tolist()) == [0, 0, 1, 1, 2]
    assert set(batch["retain"]["group_ids"].tolist()) <= {3, 4, 5}
    # A DatasetDict with named splits works too.
    DatasetDict({"forget": Dataset.from_list(FORGET), "retain": Dataset.from_list(RETAIN)}).save_to_disk(
        str(tmp_path / "dict")
    )
    assert len(read_records(tmp_path / "dict", "retain")) == 9


@pytest.mark.parametrize(
    "forget,retain,match",
    [
        ("missing.jsonl", "r.jsonl", "does not exist"),
        ("nocol.jsonl", "r.jsonl", "lacks column"),
        ("empty.jsonl", "r.jsonl", "forget set .* holds no record"),
        ("bad.jsonl", "r.jsonl", "not valid JSON"),
    ],
)
def test_clear_errors(tiny_dir, tmp_path, forget, retain, match):
    _jsonl(tmp_path / "r.jsonl", RETAIN)
    _jsonl(tmp_path / "nocol.jsonl", [{"text": "q", "answer": "a"}])
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "bad.jsonl").write_text("{not json}\n")
    dm = ForgetRetainDataModule(str(tiny_dir), str(tmp_path / forget), str(tmp_path / retain))
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        dm.setup("fit")


def test_datasets_directory_without_columns_names_them(tmp_path):
    Dataset.from_list([{"text": "x"}]).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['prompt', 'answer'\]"):
        read_records(tmp_path / "ds")


def test_reads_the_testbed_generator_output(tiny_dir, tmp_path):
    from lightning_unlearn.data.splits import save_splits

    forget = [dict(r, field="email", profile_id=i, group_id=i % 3) for i, r in enumerate(FORGET)]
    retain = [dict(r, field="phone", profile_id=50 + i, group_id=3 + i % 3) for i, r in enumerate(RETAIN)]
    save_splits(tmp_path / "splits", {"email/forget": forget, "email/retain": retain})
    dm = ForgetRetainDataModule(str(tiny_dir), str(tmp_path / "splits" / "email"), batch_size=5)
    dm.setup("fit")
    assert (len(dm.forget), len(dm.retain)) == (5, 9)
    assert sorted(r["group_ids"] for r in dm.forget.rows) == [0, 0, 1, 1, 2]
