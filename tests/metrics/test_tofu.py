import math

import numpy as np
import pytest
import torch
from scipy.stats import ks_2samp

from lightning_unlearn.losses import IGNORE_INDEX
from lightning_unlearn.metrics.tofu import (
    forget_quality,
    mean_answer_nll,
    model_utility,
    rouge_l_recall,
    truth_ratio_score,
    truth_ratios,
)


def test_mean_answer_nll_is_the_mean_over_answer_tokens_eos_included():
    # Answer tokens 2, 1, 3 at positions 2-4, predicted with probabilities 0.7, 0.2, 0.7 by logits 1-3.
    probs = torch.tensor([[0.25] * 4, [0.1, 0.1, 0.7, 0.1], [0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7], [0.25] * 4])
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 2, 1, 3]])
    nll = mean_answer_nll(probs.log().unsqueeze(0), labels)
    assert nll.item() == pytest.approx(-(math.log(0.7) + math.log(0.2) + math.log(0.7)) / 3, rel=1e-6)
    with pytest.raises(ValueError, match="no answer tokens"):
        mean_answer_nll(probs.log().unsqueeze(0), torch.full((1, 5), IGNORE_INDEX))


def test_truth_ratio_geometric_mean_of_perturbed_over_paraphrased():
    para = [0.5, 1.0]
    pert = [[1.0, 2.0], [0.5, 1.5]]
    r = truth_ratios(para, pert)
    # Sample 0: exp(-(1+2)/2) / exp(-0.5) = exp(-1); sample 1: exp(-1) / exp(-1) = 1.
    assert r.tolist() == pytest.approx([math.exp(-1.0), 1.0], rel=1e-8)
    # Two paraphrases per sample are averaged in NLL first (OU's aggregate_to_1D): (0.25 + 0.75) / 2 = 0.5.
    assert truth_ratios([[0.25, 0.75], [1.0, 1.0]], pert).tolist() == pytest.approx(r.tolist(), rel=1e-12)


def test_truth_ratio_paper_arithmetic_mean_switch():
    # The TOFU paper's equation: mean of the normalised probabilities, not of their logs.
    r = truth_ratios([0.5], [[1.0, 2.0]], perturbed_mean="arithmetic")
    assert r[0] == pytest.approx((math.exp(-1.0) + math.exp(-2.0)) / 2 / math.exp(-0.5), rel=1e-8)
    # By the AM-GM inequality the paper's ratio is never below OU's.
    assert r[0] > truth_ratios([0.5], [[1.0, 2.0]])[0]


def test_truth_ratio_score_both_aggregators():
    ratios = [0.5, 2.0, 1.0]
    # closer_to_1_better: min(0.5, 2) = 0.5, min(2, 0.5) = 0.5, min(1, 1) = 1 -> 2/3.
    assert truth_ratio_score(ratios, "closer_to_1_better") == pytest.approx(2 / 3, rel=1e-8)
    # true_better: max(0, 0.5) = 0.5, max(0, -1) = 0, max(0, 0) = 0 -> 1/6.
    assert truth_ratio_score(ratios, "true_better") == pytest.approx(1 / 6, rel=1e-12)
    with pytest.raises(ValueError, match="aggregator='prob_mean'"):
        truth_ratio_score(ratios, "prob_mean")


def test_truth_ratio_refuses_samples_without_perturbed_answers():
    with pytest.raises(ValueError, match="at least one perturbed answer"):
        truth_ratios([0.5, 1.0], np.zeros((2, 0)))


def test_forget_quality_exact_ks_p_value_of_separated_samples():
    # Two samples of 4 with every value of one below every value of the other: D = 1, and the exact two-sided
    # p-value is the chance of the two extreme orderings among C(8, 4) = 70 equally likely ones: 2 / 70.
    assert forget_quality([0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]) == pytest.approx(2 / 70, rel=1e-9)
    assert forget_quality([0.1, 0.2, 0.3], [0.1, 0.2, 0.3]) == pytest.approx(1.0)


def test_forget_quality_equals_scipy_and_ous_inverse_ratio_variant():
    rng = np.random.default_rng(0)
    a, b = rng.lognormal(0, 1, 40), rng.lognormal(0.5, 1, 30)
    assert forget_quality(a, b) == ks_2samp(a, b).pvalue
    # OU's get_forget_quality tests 1/R; the KS statistic depends only on the order, so the p-value is the same.
    assert forget_quality(a, b) == pytest.approx(ks_2samp(1 / (a + 1e-10), 1 / (b + 1e-10)).pvalue, rel=1e-12)


def test_rouge_l_recall_is_lcs_over_reference_length():
    # Reference 4 tokens; LCS with the generation is "alice lives paris" (3): recall 3/4 (precision would be 3/6).
    assert rouge_l_recall(["Alice lives somewhere near Paris, France"], ["Alice lives in Paris"]) == [0.75]
    # The stemmer (OU: on) maps "running dogs" and "run dog" to the same stems.
    assert rouge_l_recall(["run dog"], ["running dogs"]) == [1.0]
    assert rouge_l_recall(["run dog"], ["running dogs"], use_stemmer=False) == [0.0]


def test_rouge_l_recall_unicode_words_switch():
    # OU's tokenizer keeps only [a-z0-9]: Cyrillic and Chinese answers score 0 whatever they say.
    assert rouge_l_recall(["Олена живе у Києві"], ["Олена живе в Києві"]) == [0.0]
    # Unicode words: LCS "олена живе києві" = 3 of 4 reference words.
    assert rouge_l_recall(["Олена живе у Києві"], ["Олена живе в Києві"], unicode_words=True) == [0.75]
    # One token per Chinese character: LCS 王伟在北京 = 5 of the reference's 6 characters.
    assert rouge_l_recall(["王伟在北京"], ["王伟住在北京"], unicode_words=True) == [pytest.approx(5 / 6)]


def test_model_utility_harmonic_mean_of_declared_values():
    # 3 / (1/0.5 + 1/0.25 + 1/1) = 3 / 7.
    values = {"retain_prob": 0.5, "retain_rougeL": 0.25, "retain_truth_ratio": 1.0}
    assert model_utility(values) == pytest.approx(3 / 7, rel=1e-12)
    assert model_utility({**values, "retain_rougeL": 0.0}) == 0.0


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "0.5", None])
def test_model_utility_refuses_a_value_that_is_not_a_non_negative_number(bad):
    with pytest.raises(ValueError, match="retain_rougeL"):
        model_utility({"retain_prob": 0.5, "retain_rougeL": bad})
