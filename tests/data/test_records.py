import json

import pytest
from datasets import Dataset

from lightning_unlearn.data.records import TRUTH_RATIO_COLUMNS, read_records

TOFU_ROW = {
    "question": "Where was Basil Mahfouz Al-Kuwaiti born?",
    "answer": "He was born in Kuwait City.",
    "paraphrased_answer": "Kuwait City is his birthplace.",
    "perturbed_answer": ["He was born in Cairo.", "He was born in Amman."],
}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_reads_tofu_truth_ratio_columns_from_jsonl_and_parquet(tmp_path):
    records = read_records(_jsonl(tmp_path / "forget01_perturbed.jsonl", [TOFU_ROW]), require=TRUTH_RATIO_COLUMNS)
    assert records[0]["prompt"] == TOFU_ROW["question"]
    assert records[0]["paraphrased_answer"] == "Kuwait City is his birthplace."
    assert records[0]["perturbed_answer"] == ["He was born in Cairo.", "He was born in Amman."]
    parquet = tmp_path / "forget.parquet"
    Dataset.from_list([TOFU_ROW]).to_parquet(str(parquet))
    assert read_records(parquet, require=TRUTH_RATIO_COLUMNS)[0]["perturbed_answer"] == TOFU_ROW["perturbed_answer"]


def test_missing_required_column_is_one_line_naming_it_and_the_file(tmp_path):
    row = {k: v for k, v in TOFU_ROW.items() if k != "perturbed_answer"}
    path = _jsonl(tmp_path / "forget.jsonl", [row])
    assert read_records(path)[0]["paraphrased_answer"]  # optional unless required
    with pytest.raises(ValueError, match=r"lacks column 'perturbed_answer'") as err:
        read_records(path, what="forget set", require=TRUTH_RATIO_COLUMNS)
    assert "forget.jsonl" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "column, value, match",
    [
        ("perturbed_answer", "He was born in Cairo.", "non-empty list"),  # a CSV cell, not a list
        ("perturbed_answer", [], "non-empty list"),
        ("paraphrased_answer", "", "non-empty string"),
    ],
)
def test_malformed_truth_ratio_columns_are_refused(tmp_path, column, value, match):
    path = _jsonl(tmp_path / "forget.jsonl", [{**TOFU_ROW, column: value}])
    with pytest.raises(ValueError, match=match):
        read_records(path)
