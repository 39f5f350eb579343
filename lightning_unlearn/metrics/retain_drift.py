"""Retain drift (LENS Section 6): answer-token CE/PPL on retain data, ΔCE against the base, KL(p_base‖p_θ).

Per batch the functions return *sums* over answer positions (and the position count) so that batches and ranks
can be added before :func:`finalize_retain_drift` divides once: CE = Σ CE / n (pooled over answer tokens),
PPL = exp(CE), ΔCE = CE − CE_base, KL = Σ_t KL(p_base(·|x_<t) ‖ p_θ(·|x_<t)) / n over the full vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lightning_unlearn.losses import answer_token_logprobs


def retain_drift_sums(
    logits: torch.Tensor, labels: torch.Tensor, base_logits: torch.Tensor | None = None
) -> dict[str, float]:
    """``{"ce_sum", "base_ce_sum", "kl_sum", "num_tokens"}`` for one batch (base entries only with base_logits).

    Args:
        logits: the evaluated model's ``(B, T, V)``.
        labels: ``(B, T)`` with ``IGNORE_INDEX`` outside the answer (prompt masked).
        base_logits: the base model's ``(B, T, V)`` on the same batch.
    """
    token_logps, answer = answer_token_logprobs(logits, labels)
    out = {"ce_sum": float(-token_logps.sum()), "num_tokens": float(answer.sum())}
    if base_logits is not None:
        if base_logits.shape != logits.shape:
            raise ValueError(f"base logits {tuple(base_logits.shape)} and logits {tuple(logits.shape)} differ.")
        base_logps, _ = answer_token_logprobs(base_logits, labels)
        out["base_ce_sum"] = float(-base_logps.sum())
        logp = F.log_softmax(logits[:, :-1].float(), -1)
        logq = F.log_softmax(base_logits[:, :-1].float(), -1)
        kl = (logq.exp() * (logq - logp)).sum(-1)  # (B, T-1): KL(p_base ‖ p_θ) per next-token distribution
        out["kl_sum"] = float((kl * answer).sum())
    return out


def finalize_retain_drift(sums: dict[str, float], base_ce: float | None = None) -> dict[str, float]:
    """CE, PPL, and with a base CE (from ``sums['base_ce_sum']`` or ``base_ce``) ΔCE and base PPL; KL if summed."""
    n = sums["num_tokens"]
    if n <= 0:
        raise ValueError("retain drift over zero answer tokens; the retain set is empty or fully masked.")
    ce = sums["ce_sum"] / n
    out = {"ce": ce, "ppl": math.exp(ce)}
    if base_ce is None and "base_ce_sum" in sums:
        base_ce = sums["base_ce_sum"] / n
    if base_ce is not None:
        out.update(base_ce=base_ce, base_ppl=math.exp(base_ce), delta_ce=ce - base_ce)
    if "kl_sum" in sums:
        out["kl"] = sums["kl_sum"] / n
    return out
