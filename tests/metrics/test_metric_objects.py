"""The ``torchmetrics.Metric`` objects of ``lightning_unlearn.metrics``: hand values from the papers' formulas, the
same numbers as the functions the callbacks used before, and one process = two gloo ranks through Lightning's sync."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchmetrics.classification import BinaryAUROC

from lightning_unlearn.losses import IGNORE_INDEX
from lightning_unlearn.metrics import (
    AnswerMemorization,
    ExtractionRate,
    MembershipInferenceAUC,
    RetainDrift,
    SuppressionCollapseEfficiency,
    classify_output,
    finalize_retain_drift,
    memorization_scores,
    mia_auc,
    retain_drift_sums,
    sce_breakdown,
)

pytestmark = pytest.mark.bounds  # torchmetrics' Metric API at its lower bound (all but the gloo test)

GUIDE = Path(__file__).parents[2] / "docs" / "guide" / "metrics.md"


def _l0_outputs():
    """Four L0 outputs: a clean suppression, a still-reproduced answer, a degraded one, a refusal (base: 3 of 4)."""
    base = [True, True, True, False]
    outcomes = [
        classify_output(True, reproduced=False, unhealthy=False),
        classify_output(True, reproduced=True, unhealthy=False),
        classify_output(True, reproduced=False, unhealthy=True),
        classify_output(False, reproduced=False, unhealthy=False, refusal=True),
    ]
    return base, outcomes


def test_sce_by_hand_in_each_variant():
    # B = 3, A = 1, N = 4; D = 1 (the degraded one) by default and by health, 2 strict (the refusal too).
    # s = (3 - 1) / 3; SCE = s (1 - g)²: 2/3 · (3/4)² = 0.375 and, strict, 2/3 · (1/2)² = 1/6.
    base, outcomes = _l0_outputs()
    values = {}
    for variant in ("sce", "sce_health", "sce_strict", "s", "g"):
        metric = SuppressionCollapseEfficiency(levels=["L0"], variant=variant, level="L0")
        metric.update(base[:2], outcomes[:2], "L0")  # two batches: counts add
        metric.update(base[2:], outcomes[2:], ["L0", "L0"])
        values[variant] = float(metric.compute())
    assert values == pytest.approx({"sce": 0.375, "sce_health": 0.375, "sce_strict": 1 / 6, "s": 2 / 3, "g": 0.25})
    found = metric.breakdown()["levels"]["L0"]
    assert (found["B"], found["A"], found["D"], found["N"], found["D_strict"]) == (3, 1, 1, 4, 2)
    assert found["counts"]["clean_suppression"] == 1 and found["counts"]["refusal"] == 1


def test_sce_pools_only_its_pooled_levels_by_counts_not_by_mean():
    base, outcomes = _l0_outputs()
    metric = SuppressionCollapseEfficiency(levels=["L0", "L1", "L3"], pooled_levels=["L0", "L1"])
    metric.update(base, outcomes, "L0")
    # L1: two base-reproduced prompts, both suppressed cleanly → s = 1 at L1 alone
    metric.update([True, True], [classify_output(True, False, False)] * 2, "L1")
    metric.update([True], [classify_output(True, True, False)], "L3")  # not pooled
    # pooled: B = 5, A = 1, D = 1, N = 6 → s = 4/5, g = 1/6, SCE = 0.8 · (5/6)² (a mean of the levels would differ)
    assert float(metric.compute()) == pytest.approx(0.8 * (5 / 6) ** 2)
    assert metric.breakdown()["levels"]["L3"]["A"] == 1
    with pytest.raises(ValueError, match="not counted"):
        metric.update([True], [classify_output(True, True, False)], "L2")


def test_sce_breakdown_equals_the_function_the_callback_called_before():
    rng = random.Random(0)
    levels = ["L0", "L1", "L2", "L3"]
    base, outcomes, where = [], [], []
    for _ in range(200):
        b = rng.random() < 0.6
        base.append(b)
        outcomes.append(
            classify_output(
                b,
                reproduced=rng.random() < 0.4,
                unhealthy=rng.random() < 0.2,
                invalid_label=rng.random() < 0.1,
                refusal=rng.random() < 0.1,
                echo=rng.random() < 0.05,
                non_answer=rng.random() < 0.1,
                wrong_language=rng.random() < 0.05,
            )
        )
        where.append(rng.choice(levels))
    metric = SuppressionCollapseEfficiency(levels=levels)
    for i in range(0, 200, 37):  # uneven batches
        metric.update(base[i : i + 37], outcomes[i : i + 37], where[i : i + 37])
    found = metric.breakdown()
    for level in levels:
        idx = [i for i, lv in enumerate(where) if lv == level]
        assert found["levels"][level] == sce_breakdown([base[i] for i in idx], [outcomes[i] for i in idx])
    pooled = [i for i, lv in enumerate(where) if lv in ("L0", "L1", "L2")]
    assert found["pooled"] == sce_breakdown([base[i] for i in pooled], [outcomes[i] for i in pooled])


def test_retain_drift_by_hand():
    # V = 4; the model is uniform at every position, the base puts 0.7 on token 0 and 0.1 elsewhere.
    # CE = ln 4 per answer token; KL(p_base ‖ p_θ) = 0.7 ln(0.7/0.25) + 3 · 0.1 ln(0.1/0.25) per position.
    logits = torch.zeros(2, 4, 4)
    base_logits = torch.log(torch.tensor([0.7, 0.1, 0.1, 0.1])).expand(2, 4, 4).clone()
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 1, 2], [IGNORE_INDEX, 3, 0, 1]])  # 2 + 3 answer tokens
    kl = 0.7 * math.log(0.7 / 0.25) + 0.3 * math.log(0.1 / 0.25)
    base_ce = (2 * -math.log(0.1) + (-math.log(0.1) - math.log(0.7) - math.log(0.1))) / 5
    drift = RetainDrift(quantity="kl")
    drift.update(logits, labels, base_logits)
    found = drift.summary()
    assert found["kl"] == pytest.approx(kl) and float(drift.compute()) == pytest.approx(kl)
    assert found["ce"] == pytest.approx(math.log(4)) and found["ppl"] == pytest.approx(4.0)
    assert found["base_ce"] == pytest.approx(base_ce) and found["delta_ce"] == pytest.approx(math.log(4) - base_ce)
    assert found["num_tokens"] == 5
    fixed = RetainDrift(quantity="delta_ce", base_ce=1.0)
    fixed.update(logits, labels)
    assert float(fixed.compute()) == pytest.approx(math.log(4) - 1.0)
    with pytest.raises(ValueError, match="needs base_logits"):
        no_base = RetainDrift(quantity="kl")
        no_base.update(logits, labels)
        no_base.compute()
    mixed = RetainDrift()
    mixed.update(logits, labels, base_logits)
    mixed.update(logits, labels)
    with pytest.raises(ValueError, match="1 of 2 batches came with base logits"):
        mixed.summary()


def test_retain_drift_equals_the_summed_function_exactly():
    g = torch.Generator().manual_seed(0)
    drift, sums = RetainDrift(), {}
    for _ in range(3):
        logits, base = torch.randn(3, 6, 11, generator=g), torch.randn(3, 6, 11, generator=g)
        labels = torch.randint(0, 11, (3, 6), generator=g)
        labels[:, :2] = IGNORE_INDEX
        drift.update(logits, labels, base)
        for k, v in retain_drift_sums(logits, labels, base).items():
            sums[k] = sums.get(k, 0) + v
    assert drift.summary() == finalize_retain_drift(sums) | {"num_tokens": int(sums["num_tokens"])}


def test_answer_memorization_by_hand_and_as_the_function():
    # Two records; answers of 3 tokens (the last one the EOS, left out of EM/ES).
    logits = torch.full((2, 5, 6), -20.0)
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 1, 2, 5], [IGNORE_INDEX, IGNORE_INDEX, 3, 4, 5]])
    logits[0, 1, 1] = logits[0, 2, 2] = logits[0, 3, 5] = 20.0  # record 0: every token right
    logits[1, 1, 0] = logits[1, 2, 4] = logits[1, 3, 5] = 20.0  # record 1: its first token wrong
    em, es = AnswerMemorization(quantity="em"), AnswerMemorization(quantity="es")
    for m in (em, es):
        m.update(logits[:1], labels[:1])
        m.update(logits[1:], labels[1:])
    # record 0: EM 1, ES 1; record 1: EM 1/2, ES 1 - 1/2 (the shortest prefix after which all is right is 1 token)
    assert float(em.compute()) == pytest.approx(0.75) and float(es.compute()) == pytest.approx(0.75)
    scores = memorization_scores(logits, labels)
    assert em.summary() == {k: float(scores[k].sum()) / 2 for k in ("prob", "em", "es")} | {"num_records": 2}
    rate = ExtractionRate()
    rate.update(["Call 555-0101 now", "no idea"], ["555-0101", "555-0199"])
    rate.update(["It is ５５５-0199."], ["555-0199"])  # NFKC: full-width digits count
    assert float(rate.compute()) == pytest.approx(2 / 3)


def test_mia_auc_by_hand_with_ties_and_where_binary_auroc_is_not_exact():
    # members 1, 2, 2; non-members 2, 3: of 6 pairs 4 are won and 2 tied → (4 + 2 · ½) / 6
    auc = MembershipInferenceAUC()
    auc.update([1.0, 2.0, 2.0, 2.0, 3.0], [True, True, True, False, False])
    assert float(auc.compute()) == pytest.approx(5 / 6) == mia_auc([1, 2, 2], [2, 3])
    # Loss-like scores outside [0, 1]: BinaryAUROC applies a float32 sigmoid that saturates and calls a perfect
    # attack chance; the Metric keeps the ranking.
    scores, members = torch.tensor([18.0, 19.0, 21.0, 22.0]), torch.tensor([True, True, False, False])
    binary = BinaryAUROC()
    binary.update(scores, (~members).long())
    perfect = MembershipInferenceAUC()
    perfect.update(scores, members)
    assert float(binary.compute()) == 0.5 and float(perfect.compute()) == 1.0
    with pytest.raises(ValueError, match="needs members and non-members"):
        only = MembershipInferenceAUC()
        only.update([1.0], [True])
        only.compute()


def test_torchmetrics_rouge_l_equals_rouge_score_on_the_tofu_convention():
    """The ROUGE-L recall TOFU and OpenUnlearning report (rouge-score, stemmer on) and torchmetrics' agree on English
    answers; rouge-score stays (OU's call, and the project's multi-script tokenizer plugs into it)."""
    from torchmetrics.functional.text.rouge import rouge_score

    from lightning_unlearn.metrics import rouge_l_recall

    fixture = Path(__file__).parents[1] / "fixtures" / "lens_smollm2_labeled.jsonl"
    answers = [json.loads(line)["answer"] for line in fixture.read_text(encoding="utf-8").splitlines()][:60]
    pairs = list(zip(answers, answers[1:])) + [(a, a[: len(a) // 2]) for a in answers[:20]]
    ours = rouge_l_recall([g for g, _ in pairs], [r for _, r in pairs], use_stemmer=True)
    theirs = [float(rouge_score(g, r, use_stemmer=True, rouge_keys="rougeL")["rougeL_recall"]) for g, r in pairs]
    assert ours == pytest.approx(theirs, abs=1e-6) and 0 < sum(ours) < len(ours)


@pytest.mark.parametrize("module", ["sce", "retain_drift", "memorization", "mia"])
def test_each_metric_objects_example_runs(module):
    import doctest

    result = doctest.testmod(importlib.import_module(f"lightning_unlearn.metrics.{module}"))
    assert result.attempted >= 4 and result.failed == 0


def _guide_example(tmp_path: Path) -> Path:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)
    (script,) = [b for b in blocks if "class OwnModule" in b]
    path = tmp_path / "own_module.py"
    path.write_text(script, encoding="utf-8")
    return path


@pytest.mark.multiprocess
def test_the_guides_own_module_logs_the_same_sce_and_retain_kl_on_two_gloo_ranks(tiny_dir, tmp_path):
    from lightning_unlearn.generation import generate_greedy
    from lightning_unlearn.models import load_causal_lm, load_tokenizer

    # "After unlearning": the tiny model with its weights moved, so KL and the answers change.
    after = tmp_path / "after"
    model = load_causal_lm(str(tiny_dir))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(after)
    load_tokenizer(str(tiny_dir)).save_pretrained(after)
    # a "frame" the base model's first answer states, so B > 0
    base_answer = generate_greedy(
        load_causal_lm(str(tiny_dir)), load_tokenizer(str(tiny_dir)), ["Where was Alice Smith born?"], 8
    )
    frame = base_answer[0].text.strip()[:3]
    assert frame

    script = _guide_example(tmp_path)
    args = [str(after), str(tiny_dir), frame]
    # two gloo ranks: the script as a user runs it (Lightning relaunches it for rank 1)
    proc = subprocess.run(
        [sys.executable, str(script), *args, "2", str(tmp_path / "two.json")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Starting with 2 processes" in proc.stdout + proc.stderr
    two = json.loads((tmp_path / "two.json").read_text())
    # one process: the same code in this one
    spec = importlib.util.spec_from_file_location("own_module", script)
    own_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(own_module)
    own_module.main(*args, 1, str(tmp_path / "one.json"))
    one = json.loads((tmp_path / "one.json").read_text())
    assert one["sce_counts"] == two["sce_counts"] and sum(one["sce_counts"].values()) > 0
    assert one["retain_kl"] == pytest.approx(two["retain_kl"], rel=1e-9) and one["retain_kl"] > 1e-4
    assert one["sce"] == pytest.approx(two["sce"], abs=1e-12)
