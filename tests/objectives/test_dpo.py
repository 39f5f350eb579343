"""DPO (preferred answer from the data) and IdkDPO (an "I don't know" answer) on the tiny testbed."""

import math

import pytest
import torch
from conftest import FORGET, fit, write_jsonl

from lightning_unlearn.data.collate import encode_prompt_answer, pad_batch, with_answers
from lightning_unlearn.data.preference import PreferenceDataModule
from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives import DPO, IdkDPO, OptimizerConfig

PREFERRED = [{**row, "preferred": f"I cannot share contact details {i}."} for i, row in enumerate(FORGET)]


@pytest.fixture(scope="module")
def preference_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("dpo") / "forget_preferred.jsonl"
    write_jsonl(path, PREFERRED)
    return str(path)


def _preference_batch(testbed, forget_path):
    dm = PreferenceDataModule(testbed.model_dir, forget_path, testbed.retain, batch_size=2)
    dm.setup()
    return next(iter(dm.train_dataloader()))[0]


def test_preference_rows_carry_the_preferred_answer_of_their_own_prompt(testbed, preference_file):
    forget = _preference_batch(testbed, preference_file)["forget"]
    tok = testbed.tokenizer
    built = with_answers(forget, forget["preferred_ids"], tok.pad_token_id)
    rows = forget["index"].tolist()
    expected = pad_batch(
        [encode_prompt_answer(tok, PREFERRED[i]["prompt"], PREFERRED[i]["preferred"], 256) for i in rows],
        tok.pad_token_id,
    )
    assert torch.equal(built["input_ids"], expected["input_ids"]) and torch.equal(built["labels"], expected["labels"])


def test_preference_data_without_the_column_is_refused(testbed):
    dm = PreferenceDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=2)
    with pytest.raises(ValueError, match="preferred_key"):
        dm.setup()


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_dpo_and_idk_dpo_start_at_log_two(testbed, preference_file, kind):
    # At π_θ = π_ref every margin is 0: L = log 2 (scale one) or (2/β)·log 2 (OpenUnlearning's scale).
    adapter = AdapterConfig(kind=kind, dropout=0.0)
    dpo = DPO(testbed.model_dir, adapter, alpha=0.0)
    assert dpo.unlearning_loss(_preference_batch(testbed, preference_file))[0].item() == pytest.approx(
        math.log(2), rel=1e-5
    )
    dm = ForgetRetainDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=2)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))[0]
    idk = IdkDPO(testbed.model_dir, adapter, alpha=0.0, scale="two_over_beta")
    assert idk.unlearning_loss(batch)[0].item() == pytest.approx(2 / 0.1 * math.log(2), rel=1e-5)
    assert (idk.reference_model is None) == (kind == "lora")


def test_dpo_without_preferred_answers_names_the_datamodule(testbed):
    dm = ForgetRetainDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=2)
    dm.setup()
    with pytest.raises(RuntimeError, match="PreferenceDataModule"):
        DPO(testbed.model_dir).unlearning_loss(next(iter(dm.train_dataloader()))[0])


def test_idk_dpo_prefers_idk_over_the_forget_answer_after_training(testbed):
    module = IdkDPO(testbed.model_dir, AdapterConfig(kind="lora", dropout=0.0), OptimizerConfig(lr=1e-2), beta=0.5)
    dm = ForgetRetainDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=4)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))[0]
    with torch.no_grad():
        _, before = module.unlearning_loss(batch)
    fit(module, testbed, max_steps=10)
    module.eval()
    with torch.no_grad():
        _, after = module.unlearning_loss(batch)
    assert after["dpo_loss"] < before["dpo_loss"] - 0.1
    assert after["forget_nll"] > before["forget_nll"]
    assert after["preferred_nll"] < before["preferred_nll"]
