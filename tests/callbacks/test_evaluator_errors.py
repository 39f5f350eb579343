"""Mistakes a user can make with the evaluation callbacks raise one clear message."""

from __future__ import annotations

import pytest
from callback_fixtures import PROMPTS, StubLabeler, TinyCausalLM, qa_loader, qa_records
from lightning.pytorch import Trainer

from lightning_unlearn.callbacks import (
    CheckpointSelection,
    MaskAUCEvaluation,
    MemorizationEvaluation,
    RetainDriftEvaluation,
    SCEEvaluation,
    UtilityEvaluation,
)


def test_constructor_errors(tmp_path):
    with pytest.raises(ValueError, match="no prompts"):
        SCEEvaluation([], StubLabeler())
    with pytest.raises(ValueError, match="`prompt` and `level`"):
        SCEEvaluation([{"prompt": "x"}], StubLabeler())
    with pytest.raises(ValueError, match="ids are not unique"):
        SCEEvaluation([{"id": "a", "prompt": "x", "level": "L0"}] * 2, StubLabeler())
    with pytest.raises(TypeError, match="label"):
        SCEEvaluation(PROMPTS, object())
    with pytest.raises(ValueError, match="at least one split"):
        MemorizationEvaluation({})
    with pytest.raises(
        ValueError, match=r"'forget' split record 0 .* lacks column\(s\) \['answer'\]; it has \['question'\]"
    ):
        MemorizationEvaluation({"forget": [{"question": "q"}]})
    with pytest.raises(FileNotFoundError, match="retain records .* does not exist"):
        RetainDriftEvaluation(str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match="pre_path"):
        MaskAUCEvaluation(str(tmp_path / "pre"), str(tmp_path), str(tmp_path))
    with pytest.raises(ValueError, match="both control_inj_path and control_unl_path"):
        MaskAUCEvaluation(str(tmp_path), str(tmp_path), str(tmp_path), control_inj_path=str(tmp_path))
    with pytest.raises(ValueError, match=r"buffer_mib=-1: pass a positive size in MiB, or None \(null"):
        MaskAUCEvaluation(str(tmp_path), str(tmp_path), str(tmp_path), buffer_mib=-1)
    with pytest.raises(ValueError, match="out of range"):
        UtilityEvaluation([{"question": "q", "choices": ["a", "b"], "answer": 5}])
    with pytest.raises(ValueError, match="batch_size"):
        RetainDriftEvaluation(qa_records(), batch_size=0)
    with pytest.raises(ValueError, match="collapse_boundary"):
        CheckpointSelection(collapse_boundary=1.5)


def test_validate_without_adapter_or_saved_base_explains_the_fix(tiny_dir, tmp_path):
    module = TinyCausalLM(str(tiny_dir))
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        callbacks=[RetainDriftEvaluation(qa_records(), output_dir=str(tmp_path))],
        enable_model_summary=False,
    )
    with pytest.raises(RuntimeError, match="needs base-model outputs"):
        trainer.validate(module, qa_loader(module.tokenizer))


def test_validate_of_the_starting_model_is_its_own_base_when_told(tiny_dir, tmp_path):
    module = TinyCausalLM(str(tiny_dir))
    drift = RetainDriftEvaluation(qa_records(), output_dir=str(tmp_path), current_is_base=True)
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, default_root_dir=tmp_path,
                      callbacks=[drift], enable_model_summary=False)  # fmt: skip
    trainer.validate(module, qa_loader(module.tokenizer))
    (row,) = drift.rows.values()
    assert row["step"] == 0 and row["ce"] > 0 and row["delta_ce"] == 0.0 and row["base_ce"] == row["ce"]
