import pytest
import torch
from lightning.pytorch import Trainer

from lightning_unlearn.callbacks import MIAEvaluation
from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows
from lightning_unlearn.callbacks.qa_records import encode_batch
from lightning_unlearn.metrics.mia import loss_scores
from tests.callbacks.callback_fixtures import TinyCausalLM, qa_loader, qa_records

NONMEMBERS = [
    {"prompt": "Where was Carol White born?", "answer": "Carol White was born in Shelbyville."},
    {"prompt": "What is the email of Dan Brown?", "answer": "The email of Dan Brown is dan@example.com."},
    {"prompt": "What is Rust?", "answer": "Rust is a systems programming language."},
]


def test_model_equal_to_its_reference_leaks_nothing_and_auc_matches_the_pair_count(tiny_dir, tmp_path):
    module = TinyCausalLM(str(tiny_dir))
    members = qa_records()
    evaluator = MIAEvaluation(
        members,
        NONMEMBERS,
        attacks=["loss", "zlib", "min_k", "min_k_plus_plus", "gradnorm", "reference"],
        reference_model=str(tiny_dir),
        batch_size=2,
        output_dir=str(tmp_path),
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[evaluator],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.validate(module, qa_loader(module.tokenizer, repeat=1))
    (row,) = read_rows(tmp_path / "checkpoint_metrics.jsonl")
    assert (row["family"], row["num_members"], row["num_nonmembers"]) == ("mia", 4, 3)
    # The evaluated model is the reference: same AUC, PrivLeak 0; the reference attack scores 0 everywhere: AUC 0.5.
    for attack in ("loss", "zlib", "min_k", "min_k_plus_plus"):
        assert row[attack]["privleak"] == pytest.approx(0.0, abs=1e-6)
        assert row[attack]["auc"] == pytest.approx(row[attack]["reference_auc"])
    assert row["reference"]["auc"] == pytest.approx(0.5, abs=1e-6)
    assert "privleak" not in row["gradnorm"] and 0.0 <= row["gradnorm"]["auc"] <= 1.0

    def loss(r):
        batch = encode_batch(module.tokenizer, [r], 256)
        with torch.no_grad():
            logits = module.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return loss_scores(logits, batch["labels"]).item()

    # AUC = share of (member, non-member) pairs where the non-member's loss is higher (ties count half).
    m, n = [loss(r) for r in members], [loss(r) for r in NONMEMBERS]
    pairs = [1.0 if b > a else 0.5 if b == a else 0.0 for a in m for b in n]
    assert row["loss"]["auc"] == pytest.approx(sum(pairs) / len(pairs))


def test_gradnorm_refuses_sharded_parameters(tiny_dir, monkeypatch):
    from lightning_unlearn.callbacks import mia_evaluation

    module = TinyCausalLM(str(tiny_dir))
    evaluator = MIAEvaluation(qa_records(), NONMEMBERS, attacks=["loss", "gradnorm"], privleak=False, batch_size=2)
    monkeypatch.setattr(mia_evaluation, "is_sharded", lambda model: True)
    with pytest.raises(ValueError, match="gradnorm attack needs each record's whole gradient.*FSDP2"):
        evaluator._scores(module.model, module.tokenizer, qa_records(), ["loss", "gradnorm"])
    assert evaluator._scores(module.model, module.tokenizer, qa_records(), ["loss"])["loss"]  # the others still run


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "privleak needs a model"),
        ({"privleak": False, "attacks": ["reference"]}, "the reference attack needs a model"),
        ({"attacks": ["loss", "reference"]}, "privleak and the reference attack need a model"),
    ],
)
def test_privleak_or_reference_attack_without_reference_model_is_refused_in_one_line(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        MIAEvaluation(qa_records(), NONMEMBERS, **kwargs)
    assert "reference_model" in str(err.value) and "\n" not in str(err.value)
