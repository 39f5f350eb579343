import json

import pytest

from lightning_unlearn.labelers import ManualLabels


def _csv(path, rows):
    path.write_text("id,answer,label\n" + "".join(f"{i},{a},{lbl}\n" for i, a, lbl in rows), encoding="utf-8")
    return path


def test_reads_csv_and_normalizes_spellings(tmp_path):
    f = _csv(
        tmp_path / "a.csv",
        [("a", "x", "Target-Dominant"), ("b", "y", "target included"), ("c", "z", "REJECTED"), ("d", "w", "invalid")],
    )
    labels = ManualLabels.read(f)
    assert labels.ids == ("a", "b", "c", "d")
    assert labels.labels == ("Target-Dominant", "Target-Included", "Target-Rejected", "Invalid")
    assert labels.counts() == {"Target-Dominant": 1, "Target-Included": 1, "Target-Rejected": 1, "Invalid": 1}


def test_reads_jsonl(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text(json.dumps({"id": "q1", "label": "Target_Dominant"}) + "\n", encoding="utf-8")
    assert ManualLabels.read(f).by_id == {"q1": "Target-Dominant"}


def test_errors_name_the_rows_and_the_fix(tmp_path):
    f = _csv(tmp_path / "a.csv", [("a", "x", "Target-Dominant"), ("b", "y", ""), ("c", "z", "probably")])
    with pytest.raises(ValueError, match=r"line 3 \(''\), line 4 \('probably'\).*Target-Dominant"):
        ManualLabels.read(f)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ManualLabels.read(tmp_path / "missing.csv")
    g = tmp_path / "b.csv"
    g.write_text("key,value\n1,2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="needs `id` and `label` columns"):
        ManualLabels.read(g)
    h = _csv(tmp_path / "c.csv", [("a", "x", "Invalid"), ("a", "y", "Invalid")])
    with pytest.raises(ValueError, match="duplicate ids"):
        ManualLabels.read(h)
