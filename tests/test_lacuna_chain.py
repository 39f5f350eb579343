"""The whole Lacuna chain (`lightning-unlearn lacuna run`) at a very small size: every stage's export, the
splits, the extraction table, reuse on a second run, and the resurfacing attack on the result."""

from __future__ import annotations

import json

import pytest
import yaml
from datasets import load_from_disk

from lightning_unlearn.data.splits import FIELD_SPLITS, SPLIT_COLUMNS
from lightning_unlearn.data.templates import TARGET_FIELDS
from lightning_unlearn.lacuna import resurface, run_chain


@pytest.mark.slow
def test_chain_tiny(tmp_path):
    lines: list[str] = []
    reports = run_chain(str(tmp_path), size="tiny", log=lines.append)
    for stage in ("inject", "inject_unmasked"):
        export = tmp_path / stage / "export"
        assert (export / "pre" / "config.json").exists() and (export / "inj" / "model.safetensors").exists()
        assert (export / "masks.safetensors").exists()
    assert json.loads((tmp_path / "inject_unmasked" / "export" / "run.json").read_text())["masked"] is False
    for name in ("masked", "unmasked"):
        assert set(reports[name]["extraction"]) == set(TARGET_FIELDS)
        assert all(0 <= r <= 1 for r in reports[name]["extraction"].values())
    for field in TARGET_FIELDS:
        for split in FIELD_SPLITS:
            ds = load_from_disk(str(tmp_path / "splits" / field / split))
            assert tuple(ds.column_names) == SPLIT_COLUMNS
    assert any(line.startswith("Extraction rate per field") for line in lines)

    lines.clear()
    run_chain(str(tmp_path), size="tiny", log=lines.append)
    assert sum("finished before, reusing" in line for line in lines) == 7

    # the resurfacing attack on a hand-made split: one forget profile whose answer the model cannot know
    rows = {"prompt": ["Question: A B. What is her email address?\nAnswer:"], "answer": [" zq@x.org"],
            "field": ["email"], "profile_id": [0], "group_id": [0]}  # fmt: skip
    from datasets import Dataset

    splits = tmp_path / "attack_splits"
    Dataset.from_dict(rows).save_to_disk(str(splits / "email" / "forget"))
    Dataset.from_dict({**rows, "prompt": rows["prompt"] * 4, "answer": rows["answer"] * 4,
                       "field": ["email"] * 4, "profile_id": [1] * 4, "group_id": [3] * 4}).save_to_disk(
        str(splits / "relearn"))  # fmt: skip
    report = resurface(
        str(tmp_path / "instruct" / "export" / "model"),
        str(splits),
        "email",
        str(tmp_path / "attack"),
        k=3,
        max_epochs=1,
    )
    assert report["forget_profiles"] == 1 and report["k"] == 3
    assert report["leaked_profiles"] in (0, 1)
    assert json.loads((tmp_path / "attack" / "resurfacing.json").read_text())["leak_rate"] == report["leak_rate"]


@pytest.mark.slow
def test_chain_from_a_model_path_skips_pretraining(tiny_dir, tmp_path):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model:\n  init_args:\n    lr: 0.0123\n")
    work = tmp_path / "w"
    lines: list[str] = []
    reports = run_chain(str(work), size="tiny", log=lines.append, model_path=str(tiny_dir), inject_configs=[overlay])
    assert not (work / "pretrain").exists() and not (work / "tokenizer").exists()
    for stage in ("inject", "inject_unmasked"):
        assert json.loads((work / stage / "export" / "run.json").read_text())["model_path"] == str(tiny_dir)
        config = yaml.safe_load((work / stage / "lightning_logs" / "version_0" / "config.yaml").read_text())
        assert config["model"]["init_args"]["lr"] == 0.0123  # the overlay reached both injections
    assert set(reports["masked"]["extraction"]) == set(TARGET_FIELDS)

    lines.clear()
    run_chain(str(work), size="tiny", log=lines.append, model_path=str(tiny_dir), inject_configs=[overlay])
    assert sum("finished before, reusing" in line for line in lines) == 6


def test_chain_refuses_a_workdir_built_from_another_model(tiny_dir, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    (work / "chain.json").write_text(json.dumps({"size": "tiny", "model": "built-in tiny", "inject_configs": []}))
    with pytest.raises(ValueError, match="Choose another --workdir"):
        run_chain(str(work), size="tiny", model_path=str(tiny_dir))
    assert sorted(p.name for p in work.iterdir()) == ["chain.json"]


def test_chain_rejects_a_model_path_without_a_model(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        run_chain(str(tmp_path / "w"), size="tiny", model_path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="--inject-config"):
        run_chain(str(tmp_path / "w"), size="tiny", inject_configs=[str(tmp_path / "missing.yaml")])
    assert not (tmp_path / "w").exists()
