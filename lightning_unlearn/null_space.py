"""AlphaEdit's linear algebra (Fang et al. 2025; Lacuna Sec. 4.1): the null-space projector of retain keys and the
closed-form, null-space-constrained update of one weight matrix. Torch only; float64 throughout.

Shapes: keys are columns, ``K`` is ``(d_in, n)``; residuals ``R`` are ``(n, d_out)``; a weight ``W`` is
``(d_out, d_in)`` and its update ``ΔW = updateᵀ`` with ``update`` ``(d_in, d_out)``.
"""

from __future__ import annotations

import torch

from lightning_unlearn.errors import ConfigError


def null_space_projector(covariance: torch.Tensor, threshold: float) -> torch.Tensor:
    """P = U₀U₀ᵀ, U₀ the eigenvectors of the key covariance ``(d, d)`` whose eigenvalue is below ``threshold``.

    A weight update projected by P (``ΔW P``) leaves ``W k`` unchanged for every key k in the covariance's
    non-null span: the retain keys' outputs do not move.
    """
    if covariance.ndim != 2 or covariance.shape[0] != covariance.shape[1]:
        raise ConfigError(f"covariance must be square (d, d), got shape {tuple(covariance.shape)}.")
    if threshold <= 0:
        raise ConfigError(f"threshold={threshold} must be positive.")
    u, s, _ = torch.linalg.svd(covariance.double())
    null = u[:, s < threshold]
    return null @ null.T


def alphaedit_update(
    keys: torch.Tensor,
    residual: torch.Tensor,
    projector: torch.Tensor,
    previous_keys: torch.Tensor | None = None,
    l2: float = 1.0,
) -> torch.Tensor:
    """The update ``(d_in, d_out)`` with ``ΔW = updateᵀ`` that maps ``keys`` to ``residual`` inside range(P).

    AlphaEdit's ΔW = R Kᵀ P (K Kᵀ P + C_prev P + l2·I)⁻¹ is solved as ``solve(P (K Kᵀ + C_prev) + l2·I, P K R)``,
    then projected by P once more (the exact solution already lies in range(P); projecting again removes the
    round-off a small ``l2`` amplifies).

    Args:
        keys: ``(d_in, n)`` one key per column (the down-projection inputs at the edited positions).
        residual: ``(n, d_out)`` the output change wanted for each key.
        projector: ``(d_in, d_in)`` :func:`null_space_projector`.
        previous_keys: ``(d_in, d_in)`` Σ K Kᵀ of earlier edit batches (C_prev), kept so later edits preserve them.
        l2: ridge term.
    """
    if keys.shape[1] != residual.shape[0]:
        raise ConfigError(f"{keys.shape[1]} keys but {residual.shape[0]} residuals; pass one residual per key.")
    keys, residual, projector = keys.double(), residual.double(), projector.double()
    previous = torch.zeros_like(projector) if previous_keys is None else previous_keys.double()
    eye = torch.eye(projector.shape[0], device=projector.device, dtype=torch.float64)
    update = torch.linalg.solve(projector @ (keys @ keys.T + previous) + l2 * eye, projector @ keys @ residual)
    return projector @ update
