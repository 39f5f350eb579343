"""The quantization attack: round-to-nearest by hand, the LoRA-merged weight rounded and every weight restored, and
its rows at every checkpoint (once after a resume, the same from a later validate of the checkpoint)."""

from __future__ import annotations

import copy

import pytest
import torch
from callback_fixtures import PROMPTS, StubLabeler, TinyCausalLM, checkpointing_trainer, qa_loader, qa_records
from lightning.pytorch import Trainer

from lightning_unlearn.callbacks import QuantizationAttack, RetainDriftEvaluation, SCEEvaluation
from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows
from lightning_unlearn.quantization import quantize_rtn, quantized


def test_round_to_nearest_by_hand():
    # int4: qmax 7, one scale per row s = max|w| / 7 = 0.1; 0.05 / 0.1 = 0.5 rounds half to even, to 0
    w = torch.tensor([[0.7, -0.2, 0.05, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(quantize_rtn(w, 4), torch.tensor([[0.7, -0.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    # int8: qmax 127, s = 0.7 / 127; -0.2 / s = -36.29 → -36
    s = 0.7 / 127
    assert torch.allclose(quantize_rtn(w[:1], 8), torch.tensor([[127 * s, -36 * s, 9 * s, 0.0]]))
    # group-wise (2 weights a group): [1.0, 0.45] with s = 1/7: 3.15 → 3 → 3/7; [0.1, 0.03] with s = 0.1/7: 2.1 → 2
    g = quantize_rtn(torch.tensor([[1.0, 0.45, 0.1, 0.03]]), 4, group_size=2)
    assert torch.allclose(g, torch.tensor([[1.0, 3 / 7, 0.1, 0.2 / 7]]))
    with pytest.raises(ValueError, match="group_size=3 must divide"):
        quantize_rtn(w, 4, group_size=3)
    with pytest.raises(ValueError, match="bits=16"):
        quantize_rtn(w, 16)


def test_the_lora_merged_weight_is_rounded_and_every_weight_restored(tiny_dir):
    module = TinyCausalLM(str(tiny_dir), lora=True, lora_init_scale=0.5)
    model = module.model.eval()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    # by hand: merge the adapter into a copy, round its block Linears, run it
    merged = copy.deepcopy(model).merge_and_unload()
    with torch.no_grad():
        for name, layer in merged.named_modules():
            if isinstance(layer, torch.nn.Linear) and not name.endswith("lm_head"):
                layer.weight.copy_(quantize_rtn(layer.weight, 4, group_size=16))
        want = merged(input_ids=ids).logits
        with quantized(model, 4, group_size=16) as count:
            got = model(input_ids=ids).logits
        full = model(input_ids=ids).logits
    assert count > 0 and torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, full, atol=1e-3)  # the rounding changed the model
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # restored exactly


def _callbacks(out=None):
    kw = {} if out is None else {"output_dir": str(out)}
    return [
        SCEEvaluation(PROMPTS, StubLabeler(), max_new_tokens=6, batch_size=4, **kw),
        QuantizationAttack(bits=[8, 4], group_size=16, **kw),  # before the retain evaluator: order must not matter
        RetainDriftEvaluation(qa_records(), batch_size=3, **kw),
    ]


def test_attack_rows_at_every_checkpoint_once_after_a_resume_and_again_from_validate(tiny_dir, tmp_path):
    torch.manual_seed(0)
    root = tmp_path / "run"
    module = TinyCausalLM(str(tiny_dir), lora=True, lr=1.0)
    checkpointing_trainer(root, 6, _callbacks()).fit(module, qa_loader(module.tokenizer))  # "crashes" after step 6
    module2 = TinyCausalLM(str(tiny_dir), lora=True, lr=1.0)
    checkpointing_trainer(root, 8, _callbacks()).fit(
        module2, qa_loader(module2.tokenizer), ckpt_path=str(root / "ckpt" / "step=4.ckpt")
    )
    rows = read_rows(next(root.rglob("checkpoint_metrics.jsonl")))
    keys = [(r["step"], r["family"]) for r in rows]
    assert len(keys) == len(set(keys))
    attack = {r["step"]: r for r in rows if r["family"] == "quantization_attack"}
    plain = {r["step"]: r for r in rows if r["family"] == "retain_drift"}
    steps = sorted(plain)
    assert sorted(attack) == steps and steps[:3] == [2, 4, 6]
    for step, row in attack.items():
        assert set(row) >= {"int8", "int4"} and set(row["int4"]) >= {"sce", "retain_drift", "weights_rounded"}
        assert "kl" not in row["int4"]["retain_drift"]  # a LoRA run's reference pass is not the base under it
        assert row["int4"]["sce"]["pooled"]["N"] == len([p for p in PROMPTS if p["level"] in ("L0", "L1", "L2")])
        # int8 moves the retain CE less than int4 does
        assert abs(row["int8"]["retain_drift"]["ce"] - plain[step]["ce"]) < abs(
            row["int4"]["retain_drift"]["ce"] - plain[step]["ce"]
        )
    # Post hoc (validate of a saved checkpoint, as `evaluate` runs it): the same attack rows.
    out = tmp_path / "eval"
    module3 = TinyCausalLM(str(tiny_dir), lora=True)
    Trainer(accelerator="cpu", devices=1, logger=False, callbacks=_callbacks(out), enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=tmp_path).validate(
        module3, qa_loader(module3.tokenizer), ckpt_path=str(root / "ckpt" / f"step={steps[-1]}.ckpt"))  # fmt: skip
    (later,) = [r for r in read_rows(out / "checkpoint_metrics.jsonl") if r["family"] == "quantization_attack"]
    for bits in ("int8", "int4"):
        assert later[bits]["sce"]["pooled"] == attack[steps[-1]][bits]["sce"]["pooled"]
        want = attack[steps[-1]][bits]["retain_drift"]["ce"]
        assert later[bits]["retain_drift"]["ce"] == pytest.approx(want, abs=1e-5)
