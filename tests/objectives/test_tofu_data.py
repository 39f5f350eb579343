"""TOFU-shaped data (``question``, ``answer``, ``paraphrased_answer``) as Parquet, a JSON array or a datasets
folder trains NPO and feeds the evaluation callbacks, with and without a chat template; training, evaluation and
generation render the same prompt text."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import FORGET, RETAIN
from datasets import Dataset
from lightning.pytorch import Trainer

from lightning_unlearn.callbacks import MemorizationEvaluation, RetainDriftEvaluation
from lightning_unlearn.callbacks.qa_records import encode_batch
from lightning_unlearn.data.records import read_records
from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.generation import model_prompt
from lightning_unlearn.models import AdapterConfig, load_tokenizer
from lightning_unlearn.objectives import NPO, OptimizerConfig

CHAT = (
    "{% for m in messages %}<|user|> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def _tofu(rows):
    return [{"question": r["prompt"], "answer": r["answer"], "paraphrased_answer": r["answer"].upper()} for r in rows]


def _write(fmt, rows, path):
    if fmt == "parquet":
        Dataset.from_list(rows).to_parquet(str(path))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    else:
        Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


@pytest.fixture(scope="module")
def chat_model(testbed, tmp_path_factory):
    """The testbed model with a chat template on its tokenizer."""
    root = tmp_path_factory.mktemp("chat_model")
    shutil.copytree(testbed.model_dir, root / "model")
    tok = load_tokenizer(str(root / "model"))
    tok.chat_template = CHAT
    tok.save_pretrained(str(root / "model"))
    return str(root / "model")


def test_every_format_reads_the_same_records(tmp_path):
    rows = _tofu(FORGET)
    got = [read_records(_write(f, rows, tmp_path / f"forget.{f}")) for f in ("parquet", "json", "folder")]
    (tmp_path / "forget.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got.append(read_records(tmp_path / "forget.jsonl"))
    Dataset.from_list(rows).to_csv(str(tmp_path / "forget.csv"))
    got.append(read_records(tmp_path / "forget.csv"))
    for records in got:
        assert [(r["prompt"], r["answer"], r["paraphrased_answer"]) for r in records] == [
            (r["question"], r["answer"], r["paraphrased_answer"]) for r in rows
        ]
    para = read_records(tmp_path / "forget.jsonl", prompt_key="question", answer_key="paraphrased_answer")
    assert para[0]["answer"] == rows[0]["paraphrased_answer"]
    with pytest.raises(ValueError, match=r"record 0 of .* lacks column\(s\) \['query'\]; it has \['answer', "):
        read_records(tmp_path / "forget.jsonl", prompt_key="query")
    (tmp_path / "bad.json").write_text('[{"question": "q",')
    with pytest.raises(ValueError, match=r"bad.json:1 is not valid JSON"):
        read_records(tmp_path / "bad.json")


@pytest.mark.parametrize("chat_template", [False, True], ids=["plain", "chat"])
@pytest.mark.parametrize("fmt", ["parquet", "json", "folder"])
def test_tofu_data_trains_npo_and_feeds_the_evaluators(testbed, chat_model, tmp_path, fmt, chat_template):
    model_dir = chat_model
    forget = _write(fmt, _tofu(FORGET), tmp_path / f"forget.{fmt}")
    retain = _write(fmt, _tofu(RETAIN), tmp_path / f"retain.{fmt}")
    keys = {"prompt_key": "question", "chat_template": chat_template}
    dm = ForgetRetainDataModule(model_dir, forget, retain, batch_size=2, max_length=64, **keys)
    drift = RetainDriftEvaluation(retain, output_dir=str(tmp_path), **keys)
    memo = MemorizationEvaluation({"forget": forget, "paraphrase": forget}, max_new_tokens=4, output_dir=str(tmp_path),
                                  **keys)  # fmt: skip
    memo.splits["paraphrase"] = read_records(forget, prompt_key="question", answer_key="paraphrased_answer")
    module = NPO(model_dir, AdapterConfig(kind="lora", r=2, dropout=0.0), OptimizerConfig(lr=1e-3))
    trainer = Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1,
                      num_sanity_val_steps=0, callbacks=[drift, memo], default_root_dir=str(tmp_path))  # fmt: skip
    trainer.fit(module, dm)
    trainer.validate(module, dm)
    assert drift.rows and memo.rows[2]["forget"]["num_records"] == len(FORGET)

    # One rendering: the prompt tokens training sees are the evaluation's and generation's prompt.
    tok = dm.tokenizer
    record = read_records(forget, prompt_key="question")[0]
    train_ids = dm.forget.rows[0]["input_ids"]
    eval_ids = encode_batch(tok, [record], 64, chat_template)["input_ids"][0].tolist()
    assert eval_ids[: len(train_ids)] == train_ids
    rendered = model_prompt(tok, record["prompt"], chat_template)
    n_prompt = sum(1 for label in dm.forget.rows[0]["labels"] if label == -100)
    assert tok.decode(train_ids[:n_prompt], skip_special_tokens=False).removeprefix(tok.bos_token or "") == rendered
    assert rendered.startswith("<|user|>") == chat_template
