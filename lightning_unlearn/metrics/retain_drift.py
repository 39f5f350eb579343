"""Retain drift (LENS Section 6): answer-token CE/PPL on retain data, ΔCE against the base, KL(p_base‖p_θ).

Per batch the functions return *sums* over answer positions (and the position count) so that batches and ranks
can be added before :func:`finalize_retain_drift` divides once: CE = Σ CE / n (pooled over answer tokens),
PPL = exp(CE), ΔCE = CE − CE_base, KL = Σ_t KL(p_base(·|x_<t) ‖ p_θ(·|x_<t)) / n over the full vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import Metric

from lightning_unlearn.errors import ConfigError
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
            raise ConfigError(f"base logits {tuple(base_logits.shape)} and logits {tuple(logits.shape)} differ.")
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
        raise ConfigError("retain drift over zero answer tokens; the retain set is empty or fully masked.")
    ce = sums["ce_sum"] / n
    out = {"ce": ce, "ppl": math.exp(ce)}
    if base_ce is None and "base_ce_sum" in sums:
        base_ce = sums["base_ce_sum"] / n
    if base_ce is not None:
        out.update(base_ce=base_ce, base_ppl=math.exp(base_ce), delta_ce=ce - base_ce)
    if "kl_sum" in sums:
        out["kl"] = sums["kl_sum"] / n
    return out


RETAIN_QUANTITIES = ("ce", "ppl", "delta_ce", "kl", "base_ce", "base_ppl")


class RetainDrift(Metric):
    """Retain drift as a ``torchmetrics.Metric``: the sums of :func:`retain_drift_sums` added over batches and ranks.

    The states are float64 sums over answer tokens (reduced with ``sum``), so CE, ΔCE and KL are pooled over every
    answer token of every process and divided once, as :func:`finalize_retain_drift` does; a mean of per-rank CEs
    would weigh a rank's tokens by its share of sequences instead.

    Args:
        quantity: what :meth:`compute` returns (one of :data:`RETAIN_QUANTITIES`), so ``self.log("retain_kl",
            metric)`` works in any LightningModule; :meth:`summary` gives all of them.
        base_ce: the base model's CE, measured once before (ΔCE against it); without it, ΔCE and the base CE come
            from the ``base_logits`` passed to :meth:`update`.
        kwargs: ``torchmetrics.Metric``'s.

    Raises:
        ValueError: an unknown ``quantity``.

    Example::

        >>> import torch
        >>> from lightning_unlearn.metrics import RetainDrift
        >>> drift = RetainDrift(quantity="kl")
        >>> logits = torch.zeros(1, 3, 4)  # uniform next-token distributions
        >>> labels = torch.tensor([[-100, 1, 2]])  # the prompt masked, two answer tokens
        >>> drift.update(logits, labels, base_logits=logits)
        >>> float(drift.compute())  # the same distributions: no drift
        0.0
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, quantity: str = "ce", base_ce: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if quantity not in RETAIN_QUANTITIES:
            raise ConfigError(f"quantity={quantity!r}; choose one of {list(RETAIN_QUANTITIES)}.")
        self.quantity = quantity
        self.base_ce = base_ce
        for name in ("ce_sum", "base_ce_sum", "kl_sum", "num_tokens"):
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        for name in ("batches", "base_batches"):
            self.add_state(name, torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, labels: torch.Tensor, base_logits: torch.Tensor | None = None) -> None:
        """Add one batch: the evaluated model's logits, labels with the prompt masked, the base's logits (KL)."""
        sums = retain_drift_sums(logits, labels, base_logits)
        self.ce_sum += sums["ce_sum"]
        self.num_tokens += sums["num_tokens"]
        self.batches += 1
        if base_logits is not None:
            self.base_ce_sum += sums["base_ce_sum"]
            self.kl_sum += sums["kl_sum"]
            self.base_batches += 1

    def _summary(self) -> dict[str, float]:
        sums = {"ce_sum": float(self.ce_sum), "num_tokens": float(self.num_tokens)}
        with_base = int(self.base_batches)
        if with_base and with_base != int(self.batches):
            raise ConfigError(
                f"{with_base} of {int(self.batches)} batches came with base logits; KL and the base CE need them "
                "for every batch (or for none, with base_ce given)."
            )
        if with_base:
            sums["kl_sum"] = float(self.kl_sum)
            if self.base_ce is None:
                sums["base_ce_sum"] = float(self.base_ce_sum)
        return finalize_retain_drift(sums, base_ce=self.base_ce) | {"num_tokens": int(self.num_tokens)}

    def summary(self) -> dict[str, float]:
        """:func:`finalize_retain_drift` over every process's batches (CE, PPL; ΔCE with a base; KL with base logits)
        and ``num_tokens``, the answer tokens pooled.

        Raises:
            ValueError: no answer token was added, or only some batches came with base logits.
        """
        with self.sync_context(
            dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync, should_unsync=self._should_unsync
        ):
            return self._summary()

    def compute(self) -> torch.Tensor:
        """``quantity`` as a float64 scalar.

        Raises:
            ValueError: ``quantity`` needs a base (``delta_ce``, ``base_ce``, ``base_ppl``) or base logits (``kl``)
                that was not given.
        """
        found = self._summary()
        if self.quantity not in found:
            need = "base_logits in update" if self.quantity == "kl" else "base_ce or base_logits"
            raise ConfigError(f"retain drift {self.quantity!r} needs {need}; it was not given.")
        return torch.tensor(found[self.quantity], dtype=torch.float64)
