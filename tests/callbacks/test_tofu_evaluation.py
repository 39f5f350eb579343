import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from scipy.stats import ks_2samp

from lightning_unlearn.callbacks import TOFUEvaluation
from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows
from lightning_unlearn.callbacks.qa_records import encode_batch
from lightning_unlearn.metrics.tofu import mean_answer_nll
from lightning_unlearn.models import load_causal_lm
from tests.callbacks.callback_fixtures import TinyCausalLM, qa_loader, qa_records

PERTURBED = ["The quick brown fox.", "Python is a snake.", "Bob Jones was born in Springfield."]


def _tofu_records():
    return [
        {**r, "paraphrased_answer": r["answer"].lower(), "perturbed_answer": PERTURBED[i % 3 :] + PERTURBED[: i % 3]}
        for i, r in enumerate(qa_records())
    ]


def _ratios_one_by_one(model, tokenizer, records):
    """Truth ratios with one sequence per forward (no padding): OU's geometric mean, by the formula."""

    def nll(prompt, answer):
        batch = encode_batch(tokenizer, [{"prompt": prompt, "answer": answer}], 256)
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return mean_answer_nll(logits, batch["labels"]).item()

    out = []
    for r in records:
        pert = np.mean([nll(r["prompt"], a) for a in r["perturbed_answer"]])
        out.append(np.exp(-pert) / (np.exp(-nll(r["prompt"], r["paraphrased_answer"])) + 1e-10))
    return np.array(out)


def test_row_at_a_checkpoint_equals_the_metrics_by_formula(tiny_dir, tmp_path):
    torch.manual_seed(0)
    records = _tofu_records()
    module = TinyCausalLM(str(tiny_dir), lr=1.0)
    evaluator = TOFUEvaluation(
        {"forget": records[:2], "retain": records[2:]},
        reference_model=str(tiny_dir),
        max_new_tokens=8,
        batch_size=3,
        output_dir=str(tmp_path),
    )
    trainer = Trainer(
        default_root_dir=tmp_path,
        max_steps=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1), evaluator],
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, qa_loader(module.tokenizer))
    (row,) = read_rows(tmp_path / "checkpoint_metrics.jsonl")
    assert (row["step"], row["family"]) == (2, "tofu")
    forget = _ratios_one_by_one(module.model, module.tokenizer, records[:2])
    retain = _ratios_one_by_one(module.model, module.tokenizer, records[2:])
    assert row["forget"]["truth_ratio"] == pytest.approx(np.mean(np.minimum(forget, 1 / (forget + 1e-10))), abs=1e-5)
    assert row["retain"]["truth_ratio"] == pytest.approx(np.mean(np.maximum(0, 1 - retain)), abs=1e-5)
    reference = _ratios_one_by_one(load_causal_lm(tiny_dir), module.tokenizer, records[:2])
    assert evaluator.base["reference_forget_truth_ratios"] == pytest.approx(reference.tolist(), rel=1e-4)
    assert row["forget_quality"] == pytest.approx(ks_2samp(forget, reference).pvalue)
    assert 0.0 <= row["forget"]["rougeL_recall"] <= 1.0 and row["retain"]["num_records"] == 2
    ret = row["retain"]
    assert row["model_utility_of"] == ["retain/prob", "retain/rougeL_recall", "retain/truth_ratio"]
    if min(ret["prob"], ret["rougeL_recall"], ret["truth_ratio"]) > 0:
        hm = 3 / (1 / ret["prob"] + 1 / ret["rougeL_recall"] + 1 / ret["truth_ratio"])
    else:
        hm = 0.0
    assert row["model_utility"] == pytest.approx(hm)


def test_forget_quality_without_a_reference_model_is_refused_in_one_line():
    with pytest.raises(ValueError, match="set reference_model") as err:
        TOFUEvaluation({"forget": _tofu_records()})
    assert "\n" not in str(err.value)
    assert TOFUEvaluation({"forget": _tofu_records()}, forget_quality=False).reference_model is None


def test_records_without_perturbed_answers_are_refused_naming_the_column_and_file(tmp_path):
    path = tmp_path / "forget.jsonl"
    path.write_text('{"prompt": "Q?", "answer": "A.", "paraphrased_answer": "A!"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"lacks column 'perturbed_answer'.*forget.jsonl|forget.jsonl.*perturbed"):
        TOFUEvaluation({"forget": str(path)}, forget_quality=False)
