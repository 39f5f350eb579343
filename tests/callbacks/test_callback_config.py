"""The evaluation callbacks can be configured from YAML-style ``class_path``/``init_args`` (jsonargparse)."""

from __future__ import annotations

import json

import pytest
from jsonargparse import ArgumentParser
from lightning.pytorch import Callback

from lightning_unlearn.callbacks import CheckpointSelection, MemorizationEvaluation, SCEEvaluation

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)


def test_callbacks_instantiate_from_class_path(tmp_path):
    prompts = tmp_path / "suite.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"id": str(i), "prompt": f"q{i}", "level": lv}) for i, lv in enumerate(["L0", "L1", "L2"]))
    )
    forget = tmp_path / "forget.jsonl"
    forget.write_text(json.dumps({"prompt": "Where was Alice born?", "answer": "Springfield"}) + "\n")
    parser = ArgumentParser()
    parser.add_argument("--callbacks", type=list[Callback])
    cfg = parser.parse_args(
        [
            "--callbacks",
            json.dumps(
                [
                    {
                        "class_path": "lightning_unlearn.callbacks.SCEEvaluation",
                        "init_args": {
                            "prompts": str(prompts),
                            "labeler": {"class_path": "callback_fixtures.StubLabeler"},
                            "max_new_tokens": 4,
                        },
                    },
                    {
                        "class_path": "lightning_unlearn.callbacks.MemorizationEvaluation",
                        "init_args": {"splits": {"forget": str(forget)}},
                    },
                    {
                        "class_path": "lightning_unlearn.callbacks.CheckpointSelection",
                        "init_args": {"collapse_boundary": 0.4},
                    },
                ]
            ),
        ]
    )
    sce, mem, sel = parser.instantiate_classes(cfg).callbacks
    assert isinstance(sce, SCEEvaluation) and [r.level for r in sce.records] == ["L0", "L1", "L2"]
    assert type(sce.labeler).__name__ == "StubLabeler" and sce.max_new_tokens == 4
    assert isinstance(mem, MemorizationEvaluation) and mem.splits["forget"][0]["answer"] == "Springfield"
    assert isinstance(sel, CheckpointSelection) and sel.collapse_boundary == 0.4


def test_yaml_example_in_the_package_docstring_instantiates(tmp_path):
    import yaml

    import lightning_unlearn.callbacks as callbacks

    retain = tmp_path / "retain.jsonl"
    retain.write_text(json.dumps({"prompt": "Where was Alice born?", "answer": "Springfield"}) + "\n")
    doc = callbacks.__doc__
    cfg = yaml.safe_load(
        doc[doc.index("trainer:") : doc.index("Across runs")].replace("runs/lens/retain.jsonl", str(retain))
    )
    parser = ArgumentParser()
    parser.add_argument("--callbacks", type=list[Callback])
    built = parser.instantiate_classes(parser.parse_args(["--callbacks", json.dumps(cfg["trainer"]["callbacks"])]))
    names = [type(c).__name__ for c in built.callbacks]
    assert names == ["ModelCheckpoint", "SCEEvaluation", "RetainDriftEvaluation", "CheckpointSelection"]
    assert {r.level for r in built.callbacks[1].records} == {"L0", "L1", "L2", "L3", "L3-special"}
