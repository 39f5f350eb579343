"""Membership-inference scores, their AUC and MUSE's PrivLeak (Shi et al. 2024, "MUSE: Machine Unlearning Six-Way
Evaluation for Language Models"), as OpenUnlearning (OU, ``src/evals/metrics/mia/``, ``privacy.py``) computes them.

Sign convention (OU's): every score is *loss-like* — higher means "less likely a member". The AUC puts members
(the forget set) as class 0 and non-members (held-out people) as class 1, so AUC = P(score(non-member) >
score(member)): 1 when every member is more likely than every non-member, 0.5 when the attack cannot tell them
apart. Per sample, over its answer tokens (``IGNORE_INDEX`` elsewhere; position t of the logits predicts labels[t+1]):

- LOSS (Yeom et al. 2018): mean answer-token NLL, EOS included (OU's ``avg_loss``);
- zlib (Carlini et al. 2021): LOSS / len(zlib.compress(answer text as UTF-8));
- Min-K % (Shi et al. 2023, "Detecting Pretraining Data from LLMs"): −mean of the k-fraction lowest token
  log-probs, k·n rounded down and at least 1;
- Min-K %++ (Zhang et al. 2024): the same over z_t = (log p(x_t) − μ_t) / σ_t, with μ_t = Σ_v p_t(v) log p_t(v) and
  σ_t² = Σ_v p_t(v) (log p_t(v))² − μ_t² the mean and variance of the log-prob under the model's own next-token
  distribution at position t (σ_t² clamped at 1e-6);
- GradNorm (Wang et al. 2024): the mean over parameter tensors of the p-norm of ∇ of the sample's mean token NLL;
- reference (Carlini et al. 2022): LOSS(model) − LOSS(reference model).

Min-K %, Min-K %++ and GradNorm leave out each answer's last token (the EOS) by default, as OU's
``tokenwise_logprobs`` does; ``include_eos=True`` keeps it. A sample without scored tokens is an error here (OU
scores it 0).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import IGNORE_INDEX, answer_token_logprobs
from lightning_unlearn.metrics.tofu import mean_answer_nll

_SIGMA2_FLOOR = 1e-6  # OU's clamp of the per-position variance in Min-K %++


def loss_scores(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """LOSS attack, ``(B,)``: the mean answer-token NLL (EOS included)."""
    return mean_answer_nll(logits, labels)


def zlib_scores(logits: torch.Tensor, labels: torch.Tensor, answers: Sequence[str]) -> torch.Tensor:
    """zlib attack, ``(B,)``: LOSS divided by the zlib-compressed byte length of each answer's text."""
    if len(answers) != logits.shape[0]:
        raise ConfigError(f"zlib_scores got {len(answers)} answer texts for a batch of {logits.shape[0]}.")
    sizes = torch.tensor([len(zlib.compress(a.encode("utf-8"))) for a in answers], dtype=torch.float64)
    return mean_answer_nll(logits, labels) / sizes


def reference_scores(logits: torch.Tensor, reference_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Reference attack, ``(B,)``: LOSS under the model minus LOSS under the reference model, same batch."""
    return mean_answer_nll(logits, labels) - mean_answer_nll(reference_logits, labels)


def _scored_positions(labels: torch.Tensor, include_eos: bool) -> torch.Tensor:
    """``(B, T-1)`` mask of the shifted positions scored, without each answer's last token unless ``include_eos``."""
    answer = labels[:, 1:] != IGNORE_INDEX
    if not include_eos:
        n = answer.sum(-1, keepdim=True)
        answer = answer & (answer.long().cumsum(-1) < n)
    if bool((answer.sum(-1) == 0).any()):
        hint = "" if include_eos else " (a one-token answer has none once its EOS is left out; include_eos=True)"
        raise ConfigError(f"a sample has no scored answer tokens{hint}; check the collation.")
    return answer


def _min_k_mean(values: torch.Tensor, scored: torch.Tensor, k: float) -> torch.Tensor:
    if not 0.0 < k <= 1.0:
        raise ConfigError(f"k={k} is the fraction of lowest tokens kept; give 0 < k ≤ 1 (Min-K % uses 0.2).")
    out = []
    for row, mask in zip(values, scored):
        v = row[mask].sort().values
        num_k = max(1, int(v.numel() * k))
        out.append(-v[:num_k].mean())
    return torch.stack(out)


def min_k_scores(logits: torch.Tensor, labels: torch.Tensor, k: float = 0.2, include_eos: bool = False) -> torch.Tensor:
    """Min-K % attack, ``(B,)``: −mean of the ⌊k·n⌋ (≥ 1) lowest answer-token log-probs."""
    token_logps, _ = answer_token_logprobs(logits, labels)
    return _min_k_mean(token_logps.double(), _scored_positions(labels, include_eos), k)


def min_k_plus_plus_scores(
    logits: torch.Tensor, labels: torch.Tensor, k: float = 0.2, include_eos: bool = False
) -> torch.Tensor:
    """Min-K %++ attack, ``(B,)``: Min-K % over log-probs standardised by the model's own distribution per position.

    z_t = (log p_t(x_t) − μ_t) / sqrt(max(σ_t², 1e-6)), μ_t = E_{v∼p_t}[log p_t(v)], σ_t² = Var_{v∼p_t}[log p_t(v)].
    """
    log_p = torch.log_softmax(logits[:, :-1, :].float(), dim=-1)  # (B, T-1, V)
    p = log_p.exp()
    mu = (p * log_p).sum(-1)
    sigma2 = (p * log_p.square()).sum(-1) - mu.square()
    targets = labels[:, 1:].masked_fill(labels[:, 1:] == IGNORE_INDEX, 0)
    target_logp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    z = (target_logp - mu) / sigma2.clamp(min=_SIGMA2_FLOOR).sqrt()
    return _min_k_mean(z.double(), _scored_positions(labels, include_eos), k)


def gradnorm_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    p: float = 2.0,
    include_eos: bool = False,
) -> torch.Tensor:
    """GradNorm attack, ``(B,)``: mean over the parameter tensors that require grad of ‖∇_θ NLL̄_i‖_p.

    NLL̄_i is sample i's mean answer-token NLL (without its EOS by default). One forward for the batch, one
    ``torch.autograd.grad`` per sample, also under inference mode; parameters' ``.grad`` are left untouched and
    the model's train/eval mode is the caller's (OU switches the model to train mode, so its dropout, if any, is
    on).
    """
    if p not in (1, 2, float("inf")):
        raise ConfigError(f"p={p}; GradNorm takes the 1-, 2- or inf-norm.")
    params = [q for q in model.parameters() if q.requires_grad]
    if not params:
        raise ConfigError("gradnorm_scores: the model has no parameter that requires grad; nothing to take a norm of.")
    scored = _scored_positions(labels, include_eos)
    # Lightning validates under inference mode, where enable_grad alone is not enough; inputs made there are
    # inference tensors that autograd cannot save, hence the clones.
    with torch.inference_mode(False), torch.enable_grad():
        input_ids, labels, scored = input_ids.clone(), labels.clone(), scored.clone()
        attention_mask = None if attention_mask is None else attention_mask.clone()
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        token_logps, _ = answer_token_logprobs(logits, labels)
        nll = -(token_logps * scored).sum(-1) / scored.sum(-1)
        out = []
        for i in range(nll.shape[0]):
            grads = torch.autograd.grad(nll[i], params, retain_graph=i < nll.shape[0] - 1, allow_unused=True)
            norms = [g.detach().double().norm(p=p) for g in grads if g is not None]
            out.append(torch.stack(norms).mean())
    return torch.stack(out)


def mia_auc(member_scores: Sequence[float] | np.ndarray, nonmember_scores: Sequence[float] | np.ndarray) -> float:
    """ROC AUC of the attack (``sklearn.metrics.roc_auc_score``), OU's convention: members are class 0, non-members
    class 1, scores loss-like; 1 = members perfectly detectable, 0.5 = not detectable."""
    from sklearn.metrics import roc_auc_score

    m = np.asarray(member_scores, dtype=np.float64).ravel()
    n = np.asarray(nonmember_scores, dtype=np.float64).ravel()
    if m.size == 0 or n.size == 0:
        raise ConfigError(f"mia_auc needs members and non-members; got {m.size} member and {n.size} non-member scores.")
    if not (np.isfinite(m).all() and np.isfinite(n).all()):
        raise ConfigError("mia_auc got a non-finite score; check the model's logits for NaN/inf.")
    labels = np.concatenate([np.zeros(m.size), np.ones(n.size)])
    return float(roc_auc_score(labels, np.concatenate([m, n])))


def privleak(auc_model: float, auc_reference: float, orientation: Literal["muse", "membership"] = "muse") -> float:
    """MUSE's PrivLeak, in percent: (AUC_model − AUC_reference) / AUC_reference × 100.

    Args:
        auc_model: the evaluated model's ``mia_auc`` (OU's convention: 1 = members detectable).
        auc_reference: a reference model's (never trained on the forget set) ``mia_auc`` on the same sets.
        orientation: ``"muse"`` (default, OU's ``privleak``): the AUCs enter as 1 − AUC, the orientation MUSE
            reports, so a model that still leaks its forget set scores near −100 and over-unlearning is positive,
            as in MUSE's and OU's tables. ``"membership"``: the formula on the AUCs as given (leaking is positive).
            OU adds 1e-10 to the denominator; here a reference AUC that makes it 0 is refused instead.
    """
    if orientation == "muse":
        score, ref = 1.0 - auc_model, 1.0 - auc_reference
    elif orientation == "membership":
        score, ref = auc_model, auc_reference
    else:
        raise ConfigError(f"orientation={orientation!r}; use 'muse' (OU, MUSE's tables) or 'membership'.")
    if ref == 0:
        raise ConfigError(
            f"privleak: the reference AUC {auc_reference} leaves a zero denominator in the {orientation!r} "
            "orientation; the reference model separates members perfectly, so it is no unlearned reference."
        )
    return float((score - ref) / ref * 100.0)


class MembershipInferenceAUC(Metric):
    """:func:`mia_auc` as a ``torchmetrics.Metric``: every score kept (``cat`` states), the AUC formed once.

    Not ``torchmetrics.classification.BinaryAUROC``: it is exact on ties, but it reads scores outside [0, 1] as
    logits and applies a float32 sigmoid, which saturates — attack scores such as a Min-K % of 18 and 23 both become
    1.0 and a perfect attack scores 0.5. Loss-like scores are not probabilities, so the scores are kept as float64
    and ranked by scikit-learn (ties counted half, as the Mann–Whitney U).

    Args:
        kwargs: ``torchmetrics.Metric``'s.

    Example::

        >>> import torch
        >>> from lightning_unlearn.metrics import MembershipInferenceAUC
        >>> auc = MembershipInferenceAUC()
        >>> auc.update(torch.tensor([18.0, 19.0, 21.0, 22.0]), torch.tensor([True, True, False, False]))
        >>> float(auc.compute())  # every member less lossy than every non-member
        1.0
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("member_scores", [], dist_reduce_fx="cat")
        self.add_state("nonmember_scores", [], dist_reduce_fx="cat")

    def update(self, scores: torch.Tensor | Sequence[float], is_member: torch.Tensor | Sequence[bool]) -> None:
        """Add attack scores (loss-like: higher = less likely a member) and whether each sample is a member.

        Raises:
            ValueError: scores and flags differ in length.
        """
        scores = torch.as_tensor(scores, dtype=torch.float64).flatten()
        member = torch.as_tensor(is_member, dtype=torch.bool).flatten().to(scores.device)
        if scores.numel() != member.numel():
            raise ConfigError(f"{scores.numel()} scores for {member.numel()} membership flags; pass one per sample.")
        self.member_scores.append(scores[member])
        self.nonmember_scores.append(scores[~member])

    def compute(self) -> torch.Tensor:
        """P(score(non-member) > score(member)), ties half, as a float64 scalar.

        Raises:
            ValueError: no member or no non-member, or a non-finite score.
        """
        members, nonmembers = (
            dim_zero_cat(state) if len(state) else torch.zeros(0, dtype=torch.float64)
            for state in (self.member_scores, self.nonmember_scores)
        )
        return torch.tensor(mia_auc(members.cpu().numpy(), nonmembers.cpu().numpy()), dtype=torch.float64)
