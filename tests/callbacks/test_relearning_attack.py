"""The relearning attack: a recovery curve at every checkpoint (rows once after a resume), the run's own trajectory
untouched by it, and relearning the forgotten answers raises their memorization."""

from __future__ import annotations

import pytest
import torch
from callback_fixtures import TEXTS, TinyCausalLM, checkpointing_trainer, qa_loader, qa_records

from lightning_unlearn.callbacks import MemorizationEvaluation, RelearningAttack, RetainDriftEvaluation
from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows


def _evaluators():
    return [
        MemorizationEvaluation({"forget": qa_records()[:2]}, extraction=False),
        RetainDriftEvaluation(qa_records()[2:], batch_size=2),
    ]


def test_a_recovery_curve_at_every_checkpoint_once_after_a_resume_and_the_run_untouched(tiny_dir, tmp_path):
    # the mechanism on the tiny model: relearn the measured answers themselves (a real attack relearns held-out data)
    relearn = [{"prompt": p, "answer": a} for p, a in TEXTS[:2]]

    def attacked(root, max_steps, ckpt=None):
        module = TinyCausalLM(str(tiny_dir), lora=True, lr=1.0)
        attack = RelearningAttack(relearn, steps=[3, 1], lr=5e-3, batch_size=2)
        checkpointing_trainer(root, max_steps, [*_evaluators(), attack]).fit(
            module, qa_loader(module.tokenizer), ckpt_path=ckpt
        )

    torch.manual_seed(0)
    root = tmp_path / "attacked"
    attacked(root, 6)  # "crashes" after step 6, resumed from step 4
    attacked(root, 8, str(root / "ckpt" / "step=4.ckpt"))
    rows = read_rows(next(root.rglob("checkpoint_metrics.jsonl")))
    keys = [(r["step"], r["family"]) for r in rows]
    assert len(keys) == len(set(keys))
    curve = {r["step"]: r for r in rows if r["family"] == "relearning_attack"}
    memo = {r["step"]: r for r in rows if r["family"] == "memorization"}
    assert sorted(curve) == sorted(memo) and len(curve) >= 3
    for step, row in curve.items():
        assert set(row) >= {"after_1", "after_3"} and row["records"] == 2
        # three steps of relearning the answers bring their probability up (a step alone can overshoot)
        before = memo[step]["forget"]["prob"]
        assert row["after_3"]["memorization"]["forget"]["prob"] > before, step
        assert row["after_1"]["memorization"]["forget"]["prob"] != before  # the curve moves at its first point
        assert "kl" in row["after_3"]["retain_drift"]  # the adapter relearned: its base pass is still the base
    # post hoc (validate of a saved checkpoint, as `attack relearn` runs it through `evaluate`, under Lightning's
    # inference mode): the same recovery curve as during training
    from lightning.pytorch import Trainer

    out = tmp_path / "eval"
    last = max(curve)
    module = TinyCausalLM(str(tiny_dir), lora=True)
    evaluators = [
        MemorizationEvaluation({"forget": qa_records()[:2]}, extraction=False, output_dir=str(out)),
        RetainDriftEvaluation(qa_records()[2:], batch_size=2, output_dir=str(out)),
    ]
    posthoc = RelearningAttack(relearn, steps=[3, 1], lr=5e-3, batch_size=2, output_dir=str(out))
    Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[*evaluators, posthoc], enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=tmp_path).validate(
        module, qa_loader(module.tokenizer), ckpt_path=str(root / "ckpt" / f"step={last}.ckpt"))  # fmt: skip
    (later,) = [r for r in read_rows(out / "checkpoint_metrics.jsonl") if r["family"] == "relearning_attack"]
    for point in ("after_1", "after_3"):
        assert later[point]["memorization"]["forget"]["prob"] == pytest.approx(
            curve[last][point]["memorization"]["forget"]["prob"], rel=1e-4
        )
        assert later[point]["relearning_loss"] == pytest.approx(curve[last][point]["relearning_loss"], rel=1e-4)
    # the same run without the attack: the same trajectory, row for row (the attack put every weight back)
    torch.manual_seed(0)
    plain = tmp_path / "plain"
    module = TinyCausalLM(str(tiny_dir), lora=True, lr=1.0)
    checkpointing_trainer(plain, 6, _evaluators()).fit(module, qa_loader(module.tokenizer))
    plain_rows = {(r["step"], r["family"]): r for r in read_rows(next(plain.rglob("checkpoint_metrics.jsonl")))}
    for (step, family), row in plain_rows.items():
        mine = next(r for r in rows if r["step"] == step and r["family"] == family)
        if family == "memorization":
            assert mine["forget"]["prob"] == pytest.approx(row["forget"]["prob"], rel=1e-6)
        else:
            assert mine["ce"] == pytest.approx(row["ce"], rel=1e-6) and mine["kl"] == pytest.approx(row["kl"], rel=1e-6)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="steps=\\[0\\]"):
        RelearningAttack([{"prompt": "a", "answer": "b"}], steps=[0])
    with pytest.raises(ValueError, match="lr=0"):
        RelearningAttack([{"prompt": "a", "answer": "b"}], lr=0)


def test_relearned_levels_are_left_out_of_the_attacked_suppression_the_guard_reads():
    """Records that answer L1 questions: after relearning, the guard reads s on L0 and L2 only (the relearned L1
    answers would read memorization of the records as recovery)."""
    from types import SimpleNamespace

    from lightning_unlearn.metrics.selection import operating_points

    attack = RelearningAttack([{"prompt": "q", "answer": "a", "level": "L1"}, {"prompt": "r", "answer": "b"}])
    assert attack.relearned_levels == ("L1",)
    levels = {"L0": {"B": 8, "A": 6}, "L1": {"B": 6, "A": 6}, "L2": {"B": 2, "A": 0}, "L3": {"B": 5, "A": 0}}
    sce = {"levels": levels, "pooled": {"B": 16, "A": 12, "s": 0.25}}
    evaluator = SimpleNamespace(selection_levels=("L0", "L1", "L2"))
    reading = attack.unrelearned_reading(evaluator, sce)
    assert reading == {"levels": ["L0", "L2"], "B": 10, "A": 6, "s": 0.4}  # (10 - 6) / 10; L3 is not pooled
    assert attack.unrelearned_reading(SimpleNamespace(), sce) is None  # an evaluator that pools no levels
    plain = RelearningAttack([{"prompt": "q", "answer": "a"}])
    assert plain.relearned_levels == () and plain.unrelearned_reading(evaluator, sce) is None
    row = {"after_10": {"sce": {**sce, "pooled_unrelearned": reading}}, "relearned_levels": ["L1"]}
    (point,) = operating_points({5: {"sce": 0.2, "s": 0.5}}, attack={5: row})
    assert point["attacked_suppression"] == {"10 relearning steps": 0.4}
    (point,) = operating_points({5: {"sce": 0.2, "s": 0.5}}, attack={5: {"after_10": {"sce": sce}}})
    assert point["attacked_suppression"] == {"10 relearning steps": 0.25}  # no levels named: the pooled reading
