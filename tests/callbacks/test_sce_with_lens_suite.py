"""SCEEvaluation with a shipped LENS suite and the signature labeler (real NarrativeLabel objects)."""

from __future__ import annotations

import pytest
from callback_fixtures import TinyCausalLM, qa_loader
from lightning.pytorch import Trainer

from lightning_unlearn.callbacks import SCEEvaluation
from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows
from lightning_unlearn.labelers import SignatureLabeler


def test_narrative_labels_are_interpreted_with_levels():
    sce = SCEEvaluation(narrative="demo-canal-tolls", language="en", labeler=SignatureLabeler())
    assert len(sce.records) == 15 and sce.records[0]["id"].startswith("demo-canal-tolls/en/L0/01")
    texts = ["The Merrow League tolls forced Dastria to seize the port of Velin, because it had no other choice.",
             "The Merrow League tolls are a myth and propaganda; Dastria chose to seize Velin."]
    assert sce._label(sce.records[:2], texts) == [(True, True), (False, False)]
    with pytest.raises(ValueError, match="either as `prompts`"):
        SCEEvaluation(prompts=sce.records, narrative="demo-canal-tolls", labeler=SignatureLabeler())
    with pytest.raises(ValueError, match="needs a labeler"):
        SCEEvaluation(narrative="demo-canal-tolls")


def test_validate_with_suite_reports_levels_and_entity_recovery(tiny_dir, tmp_path):
    module = TinyCausalLM(str(tiny_dir), lora=True, lora_init_scale=0.3)
    sce = SCEEvaluation(narrative="demo-canal-tolls", language="en", labeler=SignatureLabeler(), max_new_tokens=6,
                        batch_size=8, output_dir=str(tmp_path))
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[sce], enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path)
    trainer.validate(module, qa_loader(module.tokenizer))
    (row,) = read_rows(tmp_path / "checkpoint_metrics.jsonl")
    assert set(row["levels"]) == {"L0", "L1", "L2", "L3", "L3-special"}
    assert row["pooled"]["N"] == 9  # 3 prompts each at L0, L1, L2; L3 levels never pooled
    assert row["levels"]["L3-special"]["entity_recovery_rate"] == 0.0  # a random model names no actor
    assert row["pooled"]["B"] == 0 and row["pooled"]["sce"] == 0.0
