"""TOFU's field metrics (Maini et al. 2024, "TOFU: A Task of Fictitious Unlearning for LLMs"), as OpenUnlearning
(OU, ``src/evals/metrics/memorization.py``, ``privacy.py``, ``utility.py``) computes them.

Per sample i, with ``nll`` the mean answer-token negative log-likelihood (EOS included, OU's ``avg_loss``), the
length-normalised probability of an answer is ``P(a)^(1/|a|) = exp(−nll(a))``:

- truth ratio  R_i = exp(−mean_k nll(perturbed_ik)) / (exp(−nll(paraphrased_i)) + 1e-10)
  (OU and TOFU's released code: the *geometric* mean over the K perturbed answers; the TOFU paper's equation takes
  the arithmetic mean of their normalised probabilities instead — ``perturbed_mean="arithmetic"``);
- truth-ratio score over samples: forget side ``closer_to_1_better`` = mean_i min(R_i, 1/(R_i + 1e-10));
  retain side ``true_better`` = mean_i max(0, 1 − R_i);
- forget quality = p-value of the two-sample Kolmogorov–Smirnov test (``scipy.stats.ks_2samp``) between the
  evaluated model's and a reference (never trained on the forget set) model's truth ratios on the forget set;
- ROUGE-L recall of the greedy answer against the reference answer (``rouge-score``; OU: stemmer on);
- model utility = harmonic mean of a declared set of retain-side numbers (TOFU: Prob, ROUGE-L and truth ratio on
  the retain, real-authors and world-facts sets).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import sequence_logprobs

TRUTH_RATIO_AGGREGATORS = ("closer_to_1_better", "true_better")
_EPS = 1e-10  # OU's guard in the truth ratio and its inverse; kept so values match OU's to the last digit


def mean_answer_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample mean answer-token NLL, ``(B,)`` float64: OU's ``avg_loss`` (every answer token, EOS included).

    Args:
        logits: ``(B, T, V)``.
        labels: ``(B, T)`` with ``IGNORE_INDEX`` outside the answer.
    """
    logps, lengths = sequence_logprobs(logits, labels)
    if bool((lengths == 0).any()):
        raise ConfigError("a sample has no answer tokens (all labels are IGNORE_INDEX); check the collation.")
    return -logps.double() / lengths.double()


def truth_ratios(
    paraphrased_nll: Sequence[float] | np.ndarray | torch.Tensor,
    perturbed_nll: Sequence[Sequence[float]] | np.ndarray | torch.Tensor,
    perturbed_mean: Literal["geometric", "arithmetic"] = "geometric",
) -> np.ndarray:
    """Per-sample truth ratio R = P̄(perturbed) / P(paraphrased), ``(N,)``.

    Args:
        paraphrased_nll: ``(N,)`` mean answer-token NLL of each paraphrased answer, or ``(N, P)`` for several
            (averaged over P first, as OU does).
        perturbed_nll: ``(N, K)`` mean answer-token NLL of each of the K perturbed (wrong) answers.
        perturbed_mean: ``"geometric"`` (OU, TOFU's code): exp(−mean_k nll_k); ``"arithmetic"`` (the TOFU paper's
            equation): mean_k exp(−nll_k).
    """
    para = np.asarray(paraphrased_nll, dtype=np.float64)
    pert = np.asarray(perturbed_nll, dtype=np.float64)
    if para.ndim == 2:
        para = para.mean(-1)
    if para.ndim != 1 or pert.ndim != 2 or pert.shape[0] != para.shape[0] or pert.shape[1] == 0:
        raise ConfigError(
            f"truth_ratios needs paraphrased (N,) or (N, P) and perturbed (N, K ≥ 1) NLLs; got {para.shape} and "
            f"{pert.shape}. Give every sample at least one perturbed answer."
        )
    if not (np.isfinite(para).all() and np.isfinite(pert).all()):
        raise ConfigError("truth_ratios got a non-finite NLL; check the model's logits for NaN/inf.")
    if perturbed_mean == "geometric":
        wrong = np.exp(-pert.mean(-1))
    elif perturbed_mean == "arithmetic":
        wrong = np.exp(-pert).mean(-1)
    else:
        raise ConfigError(f"perturbed_mean={perturbed_mean!r}; use 'geometric' (OU) or 'arithmetic' (TOFU paper).")
    return wrong / (np.exp(-para) + _EPS)


def truth_ratio_score(ratios: Sequence[float] | np.ndarray, aggregator: str) -> float:
    """The truth ratio of a set: OU's ``closer_to_1_better`` (forget) or ``true_better`` (retain) aggregation.

    - ``closer_to_1_better``: mean_i min(R_i, 1 / (R_i + 1e-10)) — 1 when true and false answers are equally likely
      (nothing left to tell them apart), small when either dominates;
    - ``true_better``: mean_i max(0, 1 − R_i) — high when the model prefers the true answer.
    """
    r = np.asarray(ratios, dtype=np.float64)
    if r.ndim != 1 or r.size == 0:
        raise ConfigError(f"truth_ratio_score needs a non-empty 1-D array of truth ratios; got shape {r.shape}.")
    if aggregator == "closer_to_1_better":
        return float(np.mean(np.minimum(r, 1.0 / (r + _EPS))))
    if aggregator == "true_better":
        return float(np.mean(np.maximum(0.0, 1.0 - r)))
    raise ConfigError(f"aggregator={aggregator!r}; use one of {TRUTH_RATIO_AGGREGATORS}.")


def forget_quality(model_ratios: Sequence[float] | np.ndarray, reference_ratios: Sequence[float] | np.ndarray) -> float:
    """TOFU's forget quality: the KS two-sample p-value of the truth ratios, evaluated vs reference model.

    Both arrays hold per-sample truth ratios on the *forget* set (``truth_ratios``). High (near 1) when the two
    distributions are indistinguishable, i.e. the evaluated model looks like one that never saw the forget set.
    ``scipy.stats.ks_2samp`` with its default (``method="auto"``: exact for small samples), as OU's ``ks_test``.
    The KS statistic depends only on the order of the values, so OU's other helper, which tests 1/R instead of R,
    gives the same p-value.
    """
    from scipy.stats import ks_2samp

    a, b = np.asarray(model_ratios, dtype=np.float64), np.asarray(reference_ratios, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1 or a.size == 0 or b.size == 0:
        raise ConfigError(
            f"forget_quality needs two non-empty 1-D arrays of truth ratios; got shapes {a.shape} and {b.shape}."
        )
    return float(ks_2samp(a, b).pvalue)


class _UnicodeWords:
    """A ``rouge-score`` tokenizer for any script: case-folded runs of letters/digits, each CJK character alone."""

    _token = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff]|[^\W_]+")

    def tokenize(self, text: str) -> list[str]:
        return self._token.findall(text.casefold())


def rouge_l_recall(
    generations: Sequence[str], references: Sequence[str], use_stemmer: bool = True, unicode_words: bool = False
) -> list[float]:
    """ROUGE-L recall per pair: LCS(generation, reference) / |reference| in tokens (``rouge-score``).

    Args:
        generations: the model's greedy answers.
        references: the reference answers, one per generation.
        use_stemmer: Porter stemming of English tokens (OU: on).
        unicode_words: tokenise any script (case-folded letter/digit runs, one token per CJK character). The
            default tokenizer of ``rouge-score`` (OU's) keeps only ``[a-z0-9]`` and scores a Cyrillic or Chinese
            answer 0 whatever it says; the stemmer is not applied with this tokenizer.
    """
    from rouge_score import rouge_scorer

    if len(generations) != len(references):
        raise ConfigError(
            f"{len(generations)} generations but {len(references)} references; give one reference per generation."
        )
    tokenizer = _UnicodeWords() if unicode_words else None
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=use_stemmer, tokenizer=tokenizer)
    # score(target, prediction): recall is measured against the target, the reference answer.
    return [float(scorer.score(ref, gen)["rougeL"].recall) for gen, ref in zip(generations, references)]


def model_utility(values: Mapping[str, float]) -> float:
    """Harmonic mean of the declared retain-side numbers (TOFU's model utility; OU's ``hm_aggregate``).

    Args:
        values: name → value, every value in [0, ∞) (TOFU's nine: Prob, ROUGE-L recall and ``true_better`` truth
            ratio on the retain, real-authors and world-facts sets). The names are the declaration: they are what
            a row records beside the utility.

    A zero among them gives 0 (the limit of the harmonic mean, as ``scipy.stats.hmean`` and OU give): a collapsed
    model whose ROUGE is 0 has no utility, and an evaluation at that checkpoint must report it, not fail. A
    negative or non-finite value is refused: it is not a rate and the harmonic mean of it means nothing.
    """
    if not values:
        raise ConfigError("model_utility needs at least one declared value; got none.")
    bad = {k: v for k, v in values.items() if not (_is_number(v) and math.isfinite(v) and v >= 0)}
    if bad:
        raise ConfigError(
            f"model_utility takes non-negative finite values; {bad} is not. Declare only rates and scores in [0, ∞) "
            "(probabilities, ROUGE, the 'true_better' truth ratio)."
        )
    from scipy.stats import hmean

    return float(hmean(np.array(list(values.values()), dtype=np.float64)))


def _is_number(v: object) -> bool:
    return isinstance(v, int | float | np.floating | np.integer) and not isinstance(v, bool)
