"""IdkNLL: the idk answers, the idk batch built from the forget prompts, and the objective on the tiny testbed."""

from importlib import resources

import pytest
import torch
from conftest import FORGET, fit

from lightning_unlearn.data.collate import encode_prompt_answer, pad_batch, with_answers
from lightning_unlearn.data.idk import IDK_LANGUAGES, IdkAnswers, idk_choice, load_idk_answers
from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.losses import normalized_nll, sequence_logprobs
from lightning_unlearn.models import AdapterConfig, load_causal_lm
from lightning_unlearn.objectives import IdkNLL, OptimizerConfig


def _batch(testbed):
    dm = ForgetRetainDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=2)
    dm.setup()
    return next(iter(dm.train_dataloader()))[0]


def test_every_lens_language_ships_an_idk_list():
    languages = resources.files("lightning_unlearn.data").joinpath("suites/languages")
    suite_languages = {p.name.removesuffix(".json") for p in languages.iterdir() if p.name.endswith(".json")}
    assert suite_languages == set(IDK_LANGUAGES)
    lists = {lang: load_idk_answers(lang) for lang in IDK_LANGUAGES}
    assert all(len(v) == 24 and len(set(v)) == 24 for v in lists.values())
    assert lists["en"][0] == "I don't know." and lists["uk"][0] == "Я не знаю." and lists["zh-Hans"][0] == "我不知道。"


def test_idk_choice_is_a_function_of_seed_and_row(tmp_path):
    picks = [idk_choice(0, i, 24) for i in range(200)]
    assert picks == [idk_choice(0, i, 24) for i in range(200)]
    assert len(set(picks)) > 15 and picks != [idk_choice(1, i, 24) for i in range(200)]
    own = tmp_path / "idk.txt"
    own.write_text("No idea.\n\nCannot say.\n")
    assert load_idk_answers(str(own)) == ["No idea.", "Cannot say."]
    with pytest.raises(FileNotFoundError, match="shipped language"):
        load_idk_answers("fr")


def test_idk_batch_equals_encoding_the_forget_prompts_with_idk_answers(testbed):
    forget = _batch(testbed)["forget"]
    tok, idk = testbed.tokenizer, IdkAnswers("en", seed=3)
    indices = forget["index"].tolist()
    built = with_answers(forget, idk.token_ids(tok, indices), tok.pad_token_id)
    expected = pad_batch(
        [encode_prompt_answer(tok, FORGET[i]["prompt"], idk.text(i), 256) for i in indices], tok.pad_token_id
    )
    for key in ("input_ids", "labels", "attention_mask"):
        assert torch.equal(built[key], expected[key]), key
    assert torch.equal(built["index"], forget["index"])


def test_idk_nll_loss_is_the_idk_and_retain_nll_of_the_start_model(testbed):
    module = IdkNLL(testbed.model_dir, AdapterConfig(kind="lora", dropout=0.0), gamma=2.0, alpha=0.5)
    batch = _batch(testbed)
    loss, logs = module.unlearning_loss(batch)
    model, tok = load_causal_lm(testbed.model_dir), testbed.tokenizer
    idk_rows = [
        encode_prompt_answer(tok, FORGET[i]["prompt"], module.idk.text(i), 64) for i in batch["forget"]["index"]
    ]

    def nll(b):
        with torch.no_grad():
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        return normalized_nll(*sequence_logprobs(logits, b["labels"])).mean().item()

    idk_nll, retain_nll = nll(pad_batch(idk_rows, tok.pad_token_id)), nll(batch["retain"])
    assert loss.item() == pytest.approx(2.0 * idk_nll + 0.5 * retain_nll, rel=1e-5)
    assert logs["forget_nll"].item() == pytest.approx(nll(batch["forget"]), rel=1e-5)
    assert idk_nll > logs["forget_nll"].item() + 1.0  # the testbed memorised the forget answers, not "I don't know"


def test_idk_nll_teaches_the_idk_answers_and_forgets(testbed):
    module = IdkNLL(testbed.model_dir, AdapterConfig(kind="lora", dropout=0.0), OptimizerConfig(lr=1e-2))
    batch = _batch(testbed)
    _, before = module.unlearning_loss(batch)
    fit(module, testbed, max_steps=10)
    module.eval()
    with torch.no_grad():
        _, after = module.unlearning_loss(batch)
    assert after["idk_nll"] < before["idk_nll"] - 1.0
    assert after["forget_nll"] > before["forget_nll"]
