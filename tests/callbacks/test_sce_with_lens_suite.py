"""SCEEvaluation with a shipped LENS suite and the signature labeler (real NarrativeLabel objects)."""

from __future__ import annotations

import json

import pytest
from callback_fixtures import TinyCausalLM, qa_loader
from lightning.pytorch import Trainer

from lightning_unlearn.callbacks import SCEEvaluation, sce_evaluation
from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows
from lightning_unlearn.data.narratives import load_suite
from lightning_unlearn.labelers import SignatureLabeler
from lightning_unlearn.workflows.lens.prepare import model_prompt


def test_narrative_labels_are_interpreted_with_levels():
    sce = SCEEvaluation(narrative="demo-canal-tolls", language="en", labeler=SignatureLabeler())
    assert len(sce.records) == 15 and sce.records[0].id.startswith("demo-canal-tolls/en/L0/01")
    texts = [
        "The Merrow League tolls forced Dastria to seize the port of Velin, because it had no other choice.",
        "The Merrow League tolls are a myth and propaganda; Dastria chose to seize Velin.",
    ]
    labels = sce._label(sce.records[:2], texts)
    assert [(lab.reproduced, lab.recovery, lab.stance) for lab in labels] == [
        (True, True, "endorse"),
        (False, False, "reject"),
    ]
    with pytest.raises(ValueError, match="either as `prompts`"):
        SCEEvaluation(prompts=sce.records, narrative="demo-canal-tolls", labeler=SignatureLabeler())
    with pytest.raises(ValueError, match="needs a labeler"):
        SCEEvaluation(narrative="demo-canal-tolls")


def test_validate_with_suite_reports_levels_and_entity_recovery(tiny_dir, tmp_path):
    module = TinyCausalLM(str(tiny_dir), lora=True, lora_init_scale=0.3)
    sce = SCEEvaluation(
        narrative="demo-canal-tolls",
        language="en",
        labeler=SignatureLabeler(),
        max_new_tokens=6,
        batch_size=8,
        output_dir=str(tmp_path),
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[sce],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.validate(module, qa_loader(module.tokenizer))
    (row,) = read_rows(tmp_path / "checkpoint_metrics.jsonl")
    assert set(row["levels"]) == {"L0", "L1", "L2", "L3", "L3-special"}
    assert row["pooled"]["N"] == 9  # 3 prompts each at L0, L1, L2; L3 levels never pooled
    assert row["levels"]["L3-special"]["entity_recovery_rate"] == 0.0  # a random model names no actor
    assert row["pooled"]["B"] == 0 and row["pooled"]["sce"] == 0.0


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _generation_inputs(module, sce, tmp_path, monkeypatch) -> list[str]:
    """Every text the callback generated from during one validate (base + checkpoint), in call order."""
    seen: list[str] = []
    real = sce_evaluation.generate_greedy

    def spy(model, tokenizer, prompts, *args, **kwargs):
        seen.extend(prompts)
        return real(model, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(sce_evaluation, "generate_greedy", spy)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[sce],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.validate(module, qa_loader(module.tokenizer))
    return seen


def test_suite_prompts_are_rendered_with_the_chat_template_like_lens(tiny_dir, tmp_path, monkeypatch):
    module = TinyCausalLM(str(tiny_dir), lora=True, lora_init_scale=0.3)
    module.tokenizer.chat_template = CHAT_TEMPLATE
    sce = SCEEvaluation(
        narrative="demo-canal-tolls",
        language="en",
        levels=["L0"],
        labeler=SignatureLabeler(),
        max_new_tokens=2,
        output_dir=str(tmp_path),
    )
    seen = _generation_inputs(module, sce, tmp_path, monkeypatch)
    expected = [model_prompt(module.tokenizer, r.prompt) for r in sce.records]
    assert expected[0] == f"<user>{sce.records[0].prompt}<assistant>"
    assert seen == expected + expected  # base (adapter off) and the checkpoint see the same rendered prompts
    # the same rows lens-baseline writes: its `prompt` column is the callback's generation input
    rows = [{"prompt": model_prompt(module.tokenizer, r.prompt)} for r in load_suite("demo-canal-tolls", "en", ["L0"])]
    assert [r["prompt"] for r in rows] == expected


def test_suite_prompts_stay_raw_without_a_template_and_baseline_prompts_untouched(tiny_dir, tmp_path, monkeypatch):
    module = TinyCausalLM(str(tiny_dir), lora=True, lora_init_scale=0.3)
    assert not getattr(module.tokenizer, "chat_template", None)
    sce = SCEEvaluation(
        narrative="demo-canal-tolls",
        language="en",
        levels=["L0"],
        labeler=SignatureLabeler(),
        max_new_tokens=2,
        output_dir=str(tmp_path / "raw"),
    )
    assert _generation_inputs(module, sce, tmp_path / "raw", monkeypatch) == [r.prompt for r in sce.records] * 2
    # forcing the template off keeps raw text even when the tokenizer has one
    module.tokenizer.chat_template = CHAT_TEMPLATE
    sce = SCEEvaluation(
        narrative="demo-canal-tolls",
        language="en",
        levels=["L0"],
        labeler=SignatureLabeler(),
        max_new_tokens=2,
        chat_template=False,
        output_dir=str(tmp_path / "off"),
    )
    assert _generation_inputs(module, sce, tmp_path / "off", monkeypatch) == [r.prompt for r in sce.records] * 2
    # a lens-baseline file carries rendered prompts already: they are generated from as they are
    rendered = [
        {
            "id": r.id,
            "prompt": model_prompt(module.tokenizer, r.prompt),
            "level": r.level,
            "narrative": r.narrative,
            "language": r.language,
        }
        for r in sce.records
    ]
    baseline = tmp_path / "baseline.jsonl"
    baseline.write_text("".join(json.dumps(r) + "\n" for r in rendered), encoding="utf-8")
    sce = SCEEvaluation(
        prompts=str(baseline), labeler=SignatureLabeler(), max_new_tokens=2, output_dir=str(tmp_path / "file")
    )
    assert _generation_inputs(module, sce, tmp_path / "file", monkeypatch) == [r["prompt"] for r in rendered] * 2
    with pytest.raises(ValueError, match="chat_template applies to a suite loaded with `narrative`"):
        SCEEvaluation(prompts=str(baseline), labeler=SignatureLabeler(), chat_template=True)


def test_mixed_adapter_batches_of_their_own_size_give_each_adapter_alone_its_answers(tiny_dir, monkeypatch):
    """`compute_adapters` answers in batches of `adapter_batch_size` prompts (each once per adapter), not of
    `batch_size`: with 15 prompts, batches of 6 / 6 / 3 (two adapters: 12 / 12 / 6 rows) against one adapter's
    4 / 4 / 4 / 3, and still each adapter's own metrics and answers."""
    import torch
    from peft import LoraConfig

    module = TinyCausalLM(str(tiny_dir), lora=True, lora_init_scale=0.3)
    second = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    torch.manual_seed(1)
    module.model.add_adapter("second", second)
    sce = SCEEvaluation(narrative="demo-canal-tolls", language="en", labeler=SignatureLabeler(), max_new_tokens=6,
                        batch_size=4, adapter_batch_size=6)  # fmt: skip
    sce.base = {"reproduced": {r.id: False for r in sce.records}}
    module.model.eval()
    rows: list[int] = []
    real = sce_evaluation.generate_greedy_adapters

    def spy(model, tokenizer, prompts, adapters, *args, **kwargs):
        rows.append(len(prompts) * len(adapters))
        return real(model, tokenizer, prompts, adapters, *args, **kwargs)

    monkeypatch.setattr(sce_evaluation, "generate_greedy_adapters", spy)
    mixed = sce.compute_adapters(module, {1: "default", 2: "second"})
    mixed_outputs = dict(sce.outputs)
    assert rows == [12, 12, 6]
    answers = {}
    for step, name in ((1, "default"), (2, "second")):
        module.model.set_adapter(name)
        assert sce.compute(None, module, step) == mixed[step]
        answers[name] = [o.answer for o in sce.outputs[step]]
        assert answers[name] == [o.answer for o in mixed_outputs[step]]
    assert answers["default"] != answers["second"]  # two adapters that answer differently
    with pytest.raises(ValueError, match="adapter_batch_size=0 must be at least 1"):
        SCEEvaluation(narrative="demo-canal-tolls", labeler=SignatureLabeler(), adapter_batch_size=0)
