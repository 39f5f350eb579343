"""Localization precision: ROC AUC of per-weight change scores against a ground-truth mask (Lacuna App. E).

With Δ_inj = θ_inj − θ_pre and Δ_unl = θ_unl − θ_inj, every weight of the evaluated parameters gets one score per
family:

- magnitude: ``raw`` |Δ_unl|; ``qtile`` quantile rank of |Δ_unl| within its tensor (ties share their average
  rank); ``layernorm`` |Δ_unl| / std(Δ_unl) over its (layer, component) — the module owning the tensor, so a
  Linear's weight and bias share one std;
- reversal: ``signrev`` −Δ_inj·Δ_unl; ``reversal`` (|Δ_inj| − |θ_unl − θ_pre|)/(|Δ_inj| + ε);
  ``dirreversal`` −Δ_unl·sign(Δ_inj)/(|Δ_inj| + ε);
- contrast against the UnMask control's change Δ_unmask (only when a control is given): ``contrast``
  |Δ_mask| − |Δ_unmask|; ``contrastnorm`` (|Δ_mask| − |Δ_unmask|)/(|Δ_mask| + |Δ_unmask| + ε) ∈ [−1, 1];
  ``compnorm`` |Δ_mask|/(|Δ_unmask| + ε).

Per-family AUCs are exact over *all* evaluated weights (:func:`exact_auc`, bounded memory). The ``composite``
family is a logistic regression over all features, scored out-of-fold (5-fold ``cross_val_predict``) on at most
``max_samples`` uniformly subsampled weights. The reported localization AUC is the max over families.

The reversal families read Δ_inj. When the injection changed nothing but the masked elements (no neutral text,
so Δ_inj is exactly 0 on most weights), they can tell the masks from Δ_inj alone, whatever the unlearning method
did. They are then still reported but left out of the max and of the composite's features (``omitted``), as the
paper leaves the contrast families out for OracleGrad, and a warning says so (the paper mixes in neutral text,
which moves every weight).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

MAGNITUDE_FAMILIES = ("raw", "qtile", "layernorm")
REVERSAL_FAMILIES = ("signrev", "reversal", "dirreversal")
CONTRAST_FAMILIES = ("contrast", "contrastnorm", "compnorm")
_SUFFIX = re.compile(r"\.(weight|bias)$")

ScoreChunks = Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]]


def exact_auc(
    chunks: ScoreChunks | Sequence[tuple[torch.Tensor, torch.Tensor]],
    chunk_size: int = 1 << 22,
    class_counts: tuple[int, int] | None = None,
) -> float:
    """Exact ROC AUC (ties count 1/2) over a stream of ``(scores, labels)`` chunks, in bounded memory.

    AUC = (#{pos > neg} + ½·#{pos = neg}) / (P·N). The scores of the minority class are gathered and sorted once;
    the majority class is streamed in pieces of ``chunk_size`` and counted with ``torch.searchsorted`` (left and
    right), so extra memory is ``min(P, N)`` scores plus one piece — never the whole score vector twice and never
    float64 copies. Counts are int64 and summed as Python ints, so the result equals
    ``sklearn.metrics.roc_auc_score`` up to float rounding of one division.

    Args:
        chunks: a zero-argument callable returning a fresh iterable of ``(scores, labels)`` (it is iterated three
            times: count, gather the minority class, stream the majority class), or a sequence of such pairs.
            ``labels`` is bool (or 0/1) of the scores' shape; scores are compared in their own dtype.
        chunk_size: elements of the majority class per ``searchsorted`` call.
        class_counts: ``(positives, negatives)`` if known; skips the counting pass.

    Returns:
        The AUC, or ``nan`` when one class is empty.
    """
    source: ScoreChunks = chunks if callable(chunks) else (lambda: chunks)
    if class_counts is None:
        n_pos = n_neg = 0
        for _, labels in source():
            p = int(labels.bool().sum())
            n_pos += p
            n_neg += labels.numel() - p
    else:
        n_pos, n_neg = class_counts
    if n_pos == 0 or n_neg == 0:
        return math.nan
    minority_is_pos = n_pos <= n_neg
    gathered = []
    for scores, labels in source():
        lab = labels.bool().reshape(-1)
        sel = lab if minority_is_pos else ~lab
        gathered.append(scores.reshape(-1)[sel])
    minority = torch.cat(gathered).sort().values
    del gathered
    if torch.isnan(minority).any():
        raise ValueError("scores contain NaN; AUC needs finite scores (check ε in ratio features).")
    wins = ties = 0  # wins = #{(pos, neg): pos > neg}
    for scores, labels in source():
        lab = labels.bool().reshape(-1)
        major = scores.reshape(-1)[~lab if minority_is_pos else lab]
        for piece in torch.split(major, chunk_size):
            piece = piece.to(minority.dtype)
            right = torch.searchsorted(minority, piece, right=True)
            # Only values present in the minority need the left bound (ties); a second full search would double
            # the cost for continuous scores, where ties are rare.
            present = right > 0
            present[present.clone()] = minority[right[present] - 1] == piece[present]
            left = right.clone()
            if bool(present.any()):
                left[present] = torch.searchsorted(minority, piece[present], right=False)
            ties += int((right - left).sum())
            # minority = positives: pos > this neg is P − right; minority = negatives: neg < this pos is left.
            wins += (len(minority) * piece.numel() - int(right.sum())) if minority_is_pos else int(left.sum())
    return (wins + 0.5 * ties) / (n_pos * n_neg)


def quantile_rank(x: torch.Tensor) -> torch.Tensor:
    """Rank of each element within ``x`` scaled to [0, 1]; tied elements share their average rank. Shape of ``x``."""
    flat = x.reshape(-1)
    n = flat.numel()
    if n <= 1:
        return torch.zeros_like(x, dtype=torch.float32)
    sorted_vals, order = flat.sort()
    _, inverse, counts = torch.unique_consecutive(sorted_vals, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0)
    avg_rank = (ends - counts + ends - 1).to(torch.float64) / 2.0  # 0-based average rank of each tie block
    ranks = torch.empty(n, dtype=torch.float64)
    ranks[order] = avg_rank[inverse]
    return (ranks / (n - 1)).to(torch.float32).view_as(x)


def layer_component(name: str) -> str:
    """The (layer, component) key of a parameter: its owning module's name (``...layers.3.mlp.down_proj``)."""
    return _SUFFIX.sub("", name)


def feature_families(with_control: bool) -> tuple[str, ...]:
    """Names of the per-weight families evaluated (contrast only with an UnMask control)."""
    return MAGNITUDE_FAMILIES + REVERSAL_FAMILIES + (CONTRAST_FAMILIES if with_control else ())


def weight_features(
    family: str,
    pre: torch.Tensor,
    inj: torch.Tensor,
    unl: torch.Tensor,
    control_delta: torch.Tensor | None = None,
    component_std: float = 1.0,
    eps: float = 1e-12,
) -> torch.Tensor:
    """One family's per-weight score for one tensor, float32 of the tensor's shape (see the module docstring)."""
    pre, inj, unl = pre.float(), inj.float(), unl.float()
    d_unl = unl - inj
    if family == "raw":
        return d_unl.abs()
    if family == "qtile":
        return quantile_rank(d_unl.abs())
    if family == "layernorm":
        return d_unl.abs() / (component_std + eps)
    d_inj = inj - pre
    if family == "signrev":
        return -(d_inj * d_unl)
    if family == "reversal":
        return (d_inj.abs() - (unl - pre).abs()) / (d_inj.abs() + eps)
    if family == "dirreversal":
        return -(d_unl * torch.sign(d_inj)) / (d_inj.abs() + eps)
    if control_delta is None:
        raise ValueError(f"family {family!r} needs the UnMask control's weight change; pass `control`.")
    a, b = d_unl.abs(), control_delta.float().abs()
    if family == "contrast":
        return a - b
    if family == "contrastnorm":
        return (a - b) / (a + b + eps)
    if family == "compnorm":
        return a / (b + eps)
    raise ValueError(f"unknown mask-AUC family {family!r}; choose from {feature_families(True)}.")


def _component_stds(names: Sequence[str], theta_inj, theta_unl) -> dict[str, float]:
    # Pooled std of Δ_unl per (layer, component), from running sums so no tensor is concatenated.
    acc: dict[str, list[float]] = {}
    for n in names:
        d = (theta_unl[n].double() - theta_inj[n].double()).reshape(-1)
        s = acc.setdefault(layer_component(n), [0.0, 0.0, 0.0])
        s[0] += d.numel()
        s[1] += float(d.sum())
        s[2] += float((d * d).sum())
    out = {}
    for key, (cnt, s1, s2) in acc.items():
        var = (s2 - s1 * s1 / cnt) / max(cnt - 1, 1)
        out[key] = math.sqrt(max(var, 0.0))
    return out


def _subsample_indices(sizes: Sequence[int], max_samples: int, seed: int) -> list[torch.Tensor]:
    """Uniform subsample of at most ``max_samples`` global positions, returned as flat indices per tensor."""
    total = sum(sizes)
    gen = torch.Generator().manual_seed(seed)
    if total <= max_samples:
        return [torch.arange(s) for s in sizes]
    # Exact-size uniform sample without materialising randperm(total): draw, dedupe, top up.
    chosen = torch.unique(torch.randint(0, total, (max_samples,), generator=gen))
    while chosen.numel() < max_samples:
        extra = torch.randint(0, total, (max_samples - chosen.numel(),), generator=gen)
        chosen = torch.unique(torch.cat([chosen, extra]))
    offsets = np.cumsum([0, *sizes])
    out = []
    for i in range(len(sizes)):
        lo = torch.searchsorted(chosen, int(offsets[i]))
        hi = torch.searchsorted(chosen, int(offsets[i + 1]))
        out.append(chosen[lo:hi] - int(offsets[i]))
    return out


def composite_auc(features: np.ndarray, labels: np.ndarray, folds: int = 5, seed: int = 0) -> float:
    """AUC of out-of-fold logistic-regression probabilities over standardized ``features`` ``(n, F)``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    labels = labels.astype(bool)
    if labels.sum() < folds or (~labels).sum() < folds:
        return math.nan
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    proba = cross_val_predict(clf, features, labels, cv=cv, method="predict_proba")[:, 1]
    return float(roc_auc_score(labels, proba))


def mask_auc(
    theta_pre: Mapping[str, torch.Tensor],
    theta_inj: Mapping[str, torch.Tensor],
    theta_unl: Mapping[str, torch.Tensor],
    label_mask: Mapping[str, torch.Tensor],
    control: Mapping[str, torch.Tensor] | None = None,
    unified_mask: Mapping[str, torch.Tensor] | None = None,
    names: Sequence[str] | None = None,
    max_samples: int = 2_000_000,
    folds: int = 5,
    seed: int = 0,
    eps: float = 1e-12,
    composite: bool = True,
) -> dict:
    """Every family's ROC AUC of the weight change against the forget mask, and the max.

    Args:
        theta_pre: pretrained weights θ_pre, ``{name: tensor}``.
        theta_inj: weights after injection θ_inj.
        theta_unl: weights after unlearning θ_unl.
        label_mask: ``{name: bool tensor}`` ground truth m^F (``masks.union_mask(packed, forget_groups)``).
        control: ``{name: Δ_unmask}``, the same method's weight change (θ_unl − θ_inj) on the UnMask control;
            ``None`` omits the contrast families (e.g. OracleGrad, whose control is undefined).
        unified_mask: ``{name: bool tensor}`` m^F ∨ m^R; when given, every AUC is also reported against it.
        names: parameters evaluated; default: every name of ``label_mask`` (pass θ_mask's names, e.g.
            ``masks.masked_parameter_names(model)``, to leave out embeddings, norms and unmasked blocks).
        max_samples: weights subsampled for the composite classifier (the paper uses 2M).
        folds: cross-validation folds of the composite.
        seed: subsample and fold seed.
        eps: ε of the ratio features.
        composite: fit the composite classifier.

    Returns:
        ``{"F": {family: auc, ..., "composite": auc, "max": auc, "best": family}, "F|R": {...} (with
        unified_mask), "num_weights": int, "num_positive": {"F": int, ...}, "num_subsampled": int,
        "inj_unchanged_fraction": share of weights with Δ_inj exactly 0, "omitted": families left out of the max
        and the composite, "warnings": [str, ...]}``.
    """
    names = list(label_mask) if names is None else list(names)
    if not names:
        raise ValueError("mask_auc got no parameters to evaluate; pass `names` or a non-empty label_mask.")
    for n in names:
        for what, d in (
            ("theta_pre", theta_pre),
            ("theta_inj", theta_inj),
            ("theta_unl", theta_unl),
            ("label_mask", label_mask),
        ) + ((("control", control),) if control is not None else ()):
            if n not in d:
                raise ValueError(f"parameter {n!r} is missing from {what}; all dicts must share the same names.")
            if tuple(d[n].shape) != tuple(theta_unl[n].shape):
                raise ValueError(f"{what}[{n!r}] has shape {tuple(d[n].shape)}, expected {tuple(theta_unl[n].shape)}.")
    families = feature_families(control is not None)
    stds = _component_stds(names, theta_inj, theta_unl) if "layernorm" in families else {}
    labels_by_key = {"F": label_mask} | ({"F|R": unified_mask} if unified_mask is not None else {})

    def feature(family: str, n: str) -> torch.Tensor:
        return weight_features(
            family,
            theta_pre[n],
            theta_inj[n],
            theta_unl[n],
            None if control is None else control[n],
            stds.get(layer_component(n), 1.0),
            eps,
        )

    def stream(family: str, labels: Mapping[str, torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for n in names:
            yield feature(family, n), labels[n]

    result: dict = {"num_weights": sum(theta_unl[n].numel() for n in names), "num_positive": {}, "warnings": []}
    unchanged = sum(int((theta_inj[n] == theta_pre[n]).sum()) for n in names) / max(result["num_weights"], 1)
    result["inj_unchanged_fraction"] = unchanged
    result["omitted"] = list(REVERSAL_FAMILIES) if unchanged > 0.5 else []
    if result["omitted"]:
        result["warnings"].append(
            f"Δ_inj is exactly 0 on {unchanged:.1%} of the weights (the injection moved only masked elements, e.g. "
            "no neutral text), so the reversal families (signrev, reversal, dirreversal) can find the injection "
            "masks from Δ_inj alone; they are left out of the max and the composite. Inject with neutral text, "
            "as the paper does, to score them."
        )
    for key, labels in labels_by_key.items():
        n_pos = sum(int(labels[n].bool().sum()) for n in names)
        result["num_positive"][key] = n_pos
        counts = (n_pos, result["num_weights"] - n_pos)
        result[key] = {
            f: exact_auc(lambda f=f, labels=labels: stream(f, labels), class_counts=counts) for f in families
        }

    if composite:
        idx = _subsample_indices([theta_unl[n].numel() for n in names], max_samples, seed)
        scored = [f for f in families if f not in result["omitted"]]
        cols = [torch.cat([feature(f, n).reshape(-1)[i] for n, i in zip(names, idx)]) for f in scored]
        x = torch.stack(cols, dim=1).double().numpy()
        result["num_subsampled"] = int(x.shape[0])
        for key, labels in labels_by_key.items():
            y = torch.cat([labels[n].bool().reshape(-1)[i] for n, i in zip(names, idx)]).numpy()
            result[key]["composite"] = composite_auc(x, y, folds, seed)
    for key in labels_by_key:
        finite = {
            f: v for f, v in result[key].items()
            if isinstance(v, float) and not math.isnan(v) and f not in result["omitted"]
        }  # fmt: skip
        best = max(finite, key=finite.get) if finite else None
        result[key]["max"] = finite[best] if best else math.nan
        result[key]["best"] = best
    return result
