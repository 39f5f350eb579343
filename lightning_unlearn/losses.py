"""Pure loss math for unlearning objectives. Imports torch only.

Conventions: ``labels`` are the input ids shifted by nothing (HF causal-LM style): position ``t`` of
``logits`` predicts ``labels[t + 1]``; prompt and padding positions carry ``IGNORE_INDEX`` (-100).
Per-sequence quantities are returned with shape ``(B,)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def answer_token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of every next token and which positions are answer tokens.

    Args:
        logits: ``(B, T, V)``.
        labels: ``(B, T)`` with ``IGNORE_INDEX`` on prompt and padding.

    Returns:
        ``(token_logps, answer_mask)``, both ``(B, T-1)``; ``token_logps`` is 0 where ``answer_mask`` is False.
    """
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    answer_mask = shift_labels != IGNORE_INDEX
    safe_labels = shift_labels.masked_fill(~answer_mask, 0)
    # log_softmax + gather == -cross_entropy per token; cross_entropy avoids materialising (B, T, V) log-probs twice.
    token_logps = -F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)), safe_labels.reshape(-1), reduction="none"
    ).view_as(safe_labels)
    return token_logps * answer_mask, answer_mask


def sequence_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(y|x) summed over answer tokens only, and |y| (answer-token count), both ``(B,)``."""
    token_logps, answer_mask = answer_token_logprobs(logits, labels)
    return token_logps.sum(-1), answer_mask.sum(-1)
