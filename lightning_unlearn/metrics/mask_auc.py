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

Per-family AUCs are exact over *all* evaluated weights (:func:`exact_auc`: the scores held once, each class
sorted in place, about the cost of one sort). The weights may be model directories, read one tensor at a time, so
no model is ever whole in memory (:func:`mask_auc`). The ``composite`` family is a logistic regression over all
features, scored out-of-fold (5-fold ``cross_val_predict``) on at most ``max_samples`` uniformly subsampled
weights. The reported localization AUC is the max over families.

The reversal families read Δ_inj. When the injection changed nothing but the masked elements (no neutral text,
so Δ_inj is exactly 0 off the masks), ``reversal`` tells the masks from Δ_inj alone, whatever the unlearning method
did: off the masks it is (0 − |Δ_unl|)/ε, a huge negative, so even pure noise scores about 0.91 with masks on 30 % of
the weights and 0.67 for AUC(F) with two 40 % masks (every weight off the masks ranks below every weight on them).
That holds for any share of exactly unchanged weights, so the rule applies above
:data:`UNCHANGED_FRACTION_LIMIT` (0.1 %: exact zeros on a share u of the weights lift a noise AUC(F) to
0.5 + u / (2 (1 − f)), f the forget mask's share). It is then still
reported but left out of the max and of the composite's features (``omitted``), as the paper leaves the contrast
families out for OracleGrad, and a warning says so. ``signrev`` and ``dirreversal`` stay in: off the masks they are
exactly 0 and on them symmetric about 0 for a change unrelated to the injection, so noise scores 0.5 on them; they
are the families that see a change which reverses the injection (the magnitude and contrast families cannot see
masks drawn uniformly within each tensor).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.masks import mask_shape

MAGNITUDE_FAMILIES = ("raw", "qtile", "layernorm")
REVERSAL_FAMILIES = ("signrev", "reversal", "dirreversal")
CONTRAST_FAMILIES = ("contrast", "contrastnorm", "compnorm")
# Left out of the max and the composite when Δ_inj is exactly 0 on more than UNCHANGED_FRACTION_LIMIT of the weights
# (see the module docstring). Until Dec 7 the limit was one half, which a testbed with 40 % masks (20 % unchanged)
# passed, and its `reversal` scored every method's AUC(F) 0.67 and AUC(F|R) 1.00.
SPARSE_INJECTION_OMITTED = ("reversal",)
UNCHANGED_FRACTION_LIMIT = 0.001
_SUFFIX = re.compile(r"\.(weight|bias)$")

ScoreChunks = Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]]
WeightSource = Mapping[str, torch.Tensor] | str | os.PathLike
ControlSource = Mapping[str, torch.Tensor] | tuple[WeightSource, WeightSource]

log = logging.getLogger("lightning_unlearn")


def _flat_scores(scores: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(scores, torch.Tensor):
        scores = scores.detach().reshape(-1)
        if scores.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds every value, order unchanged
            scores = scores.float()
        return scores.cpu().numpy()
    return np.asarray(scores).reshape(-1)


def _flat_labels(labels: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        return labels.detach().reshape(-1).bool().cpu().numpy()
    return np.asarray(labels).reshape(-1).astype(bool, copy=False)


def _twice_count_below(table: np.ndarray, queries: np.ndarray, chunk_size: int) -> int:
    """Σ over ``queries`` q of #{t < q} + #{t ≤ q} for t in ``table``; both sorted ascending."""
    total = 0
    for start in range(0, len(queries), chunk_size):
        q = queries[start : start + chunk_size]
        # The piece's queries all fall in table[lo:hi], a slice about N / Q times the piece's length: searching that
        # slice alone keeps every step of every binary search in cache (the whole table would not fit).
        lo = int(np.searchsorted(table, q[0], side="left"))
        hi = int(np.searchsorted(table, q[-1], side="right"))
        window = table[lo:hi]
        left = np.searchsorted(window, q, side="left")
        total += 2 * (int(left.sum(dtype=np.int64)) + lo * len(q))
        if not len(window):
            continue
        # #{t ≤ q} − #{t < q} is q's ties. Only a query equal to the entry at its left bound has any, so the right
        # search runs on those alone (few for continuous scores; a second full search would cost 1.6×).
        tied = window[np.minimum(left, len(window) - 1)] == q
        if tied.any():
            right = np.searchsorted(window, q[tied], side="right")
            total += int((right - left[tied]).sum(dtype=np.int64))
    return total


_NAN_SCORES = "scores contain NaN; AUC needs finite scores (check ε in ratio features)."


def _counts_differ(positives: int, negatives: int, class_counts) -> str:
    return f"the chunks hold {positives} positives and {negatives} negatives, but class_counts={class_counts}."


def _checked_chunks(source: ScoreChunks) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for scores, labels in source():
        s, lab = _flat_scores(scores), _flat_labels(labels)
        if s.size != lab.size:
            raise ConfigError(f"a chunk has {s.size} scores but {lab.size} labels; pass labels of the scores' shape.")
        yield s, lab


def exact_auc(
    chunks: ScoreChunks | Sequence[tuple[torch.Tensor, torch.Tensor]],
    chunk_size: int = 1 << 16,
    class_counts: tuple[int, int] | None = None,
    max_buffer_bytes: int | None = None,
    spill_dir: str | os.PathLike | None = None,
) -> float:
    """Exact ROC AUC (ties count 1/2) over a stream of ``(scores, labels)`` chunks, in one copy of the scores.

    AUC = (#{pos > neg} + ½·#{pos = neg}) / (P·N). The chunks are copied into one preallocated buffer, positives in
    front and negatives behind (``np.compress``), and each part is sorted in place: the two sorts together cost
    about one sort of all scores. Then the smaller class is looked up in the larger with ``np.searchsorted`` in
    pieces of ``chunk_size``: for a positive p, ``left`` counts negatives below p and ``right`` those at or below,
    so 2·(wins + ½·ties) = Σ_p (left + right) exactly. Counts are int64 summed as Python ints, so the result equals
    ``sklearn.metrics.roc_auc_score`` up to the rounding of the one final division. Extra memory: the scores once
    in their dtype (4 bytes a score for float32) plus one piece.

    With ``max_buffer_bytes``, scores that would take more than that spill instead (:class:`_SpilledScores`): each
    score becomes an unsigned sort key (its bit pattern, ordered as the values), written to a temporary file of its
    class while the keys' top 16 bits are counted. The key range is then cut into runs of bins that fit the budget;
    each run is read back, sorted and counted as above, and a run's negatives below it all lose to its positives.
    A bin alone beyond the budget is counted by its next 16 bits in one more read (for float32, those bins are
    single values: all ties). The result is the same integer count, so the same AUC; memory is the budget plus
    one 16 MiB piece, and the disk holds the keys once.

    Args:
        chunks: a zero-argument callable returning a fresh iterable of ``(scores, labels)`` (iterated once with
            ``class_counts``, twice without), or a sequence of such pairs; torch tensors or numpy arrays.
            ``labels`` is bool (or 0/1) of the scores' shape. Scores are compared in the first chunk's dtype
            (bfloat16 as float32).
        chunk_size: queries per ``searchsorted`` call.
        class_counts: ``(positives, negatives)`` if known; skips the counting pass.
        max_buffer_bytes: the most bytes of scores held in memory at once; ``None``: every score (no spill).
        spill_dir: the parent of the spill's temporary directory (default: the system's, ``$TMPDIR``).

    Returns:
        The AUC, or ``nan`` when one class is empty.

    Raises:
        ValueError: a score is NaN, a chunk's labels do not match its scores' size, or ``class_counts`` does not
            match the chunks.
    """
    source: ScoreChunks = chunks if callable(chunks) else (lambda: chunks)
    if class_counts is None:
        n_pos = n_neg = 0
        for _, labels in source():
            lab = _flat_labels(labels)
            p = int(np.count_nonzero(lab))
            n_pos += p
            n_neg += lab.size - p
    else:
        n_pos, n_neg = (int(c) for c in class_counts)
    if n_pos == 0 or n_neg == 0:
        return math.nan
    total = n_pos + n_neg
    pairs = _checked_chunks(source)
    first = next(pairs, None)
    if first is None:
        raise ConfigError(f"the chunks hold no scores, but class_counts={class_counts}.")
    pairs = itertools.chain([first], pairs)
    itemsize = max(first[0].itemsize, 2)
    if max_buffer_bytes is not None and total * itemsize > max_buffer_bytes:
        with tempfile.TemporaryDirectory(prefix="exact_auc_", dir=spill_dir) as folder:
            budget = max(int(max_buffer_bytes) // itemsize, 1)
            spilled = _SpilledScores(folder, pairs, (n_pos, n_neg), budget, chunk_size)
            return spilled.twice_wins() / (2 * n_pos * n_neg)
    buffer = None  # (P + N,): [0, P) the positives' scores, [P, P + N) the negatives'
    at_pos, at_neg = 0, n_pos
    for s, lab in pairs:
        if buffer is None:
            buffer = np.empty(total, dtype=s.dtype)
        s = s.astype(buffer.dtype, copy=False)
        k = int(np.count_nonzero(lab))
        if at_pos + k > n_pos or at_neg + s.size - k > total:
            raise ConfigError(f"the chunks hold more scores than class_counts={class_counts} says.")
        np.compress(lab, s, out=buffer[at_pos : at_pos + k])
        np.compress(~lab, s, out=buffer[at_neg : at_neg + s.size - k])
        at_pos, at_neg = at_pos + k, at_neg + s.size - k
    if at_pos != n_pos or at_neg != total:
        raise ConfigError(_counts_differ(at_pos, at_neg - n_pos, class_counts))
    pos, neg = buffer[:n_pos], buffer[n_pos:]
    pos.sort()
    neg.sort()
    if buffer.dtype.kind in "fc" and (np.isnan(pos[-1]) or np.isnan(neg[-1])):  # numpy sorts NaN last
        raise ConfigError(_NAN_SCORES)
    return _twice_wins_sorted(pos, neg, chunk_size) / (2 * n_pos * n_neg)


def _twice_wins_sorted(pos: np.ndarray, neg: np.ndarray, chunk_size: int) -> int:
    """2·(#{p > n} + ½·#{p = n}) over all pairs of two sorted arrays; the smaller is looked up in the larger."""
    if len(pos) <= len(neg):
        return _twice_count_below(neg, pos, chunk_size)
    # per negative n: 2·#{p > n} + #{p = n} = 2P − #{p < n} − #{p ≤ n}
    return 2 * len(pos) * len(neg) - _twice_count_below(pos, neg, chunk_size)


_PREFIX_BITS = 16  # a spilled exact AUC splits the sort keys 16 bits at a time
_SPILL_PIECE = 1 << 22  # keys converted or read back at a time (16 MiB of float32)


def _sort_keys(s: np.ndarray) -> np.ndarray:
    """Unsigned integers in the order of the scores ``s``, equal exactly where the scores are (−0.0 = +0.0)."""
    u = s.view(f"u{s.itemsize}")
    top = u.dtype.type(1 << (8 * s.itemsize - 1))
    if s.dtype.kind in "ub":
        return u.copy()
    if s.dtype.kind == "i":
        return u ^ top
    u = (s + s.dtype.type(0)).view(u.dtype)  # −0.0 + 0.0 = +0.0
    return np.where(u >= top, ~u, u | top)  # a negative: every bit flipped; a positive: above every negative


def _read_keys(path: str, dtype: np.dtype) -> Iterator[np.ndarray]:
    start = 0
    while True:
        keys = np.fromfile(path, dtype=dtype, count=_SPILL_PIECE, offset=start * dtype.itemsize)
        if not keys.size:
            return
        start += keys.size
        yield keys


class _SpilledScores:
    """Every score's sort key, positives and negatives in two files of ``folder``, and how many of each class
    fall in each bin of the keys' top 16 bits; :meth:`twice_wins` counts the pairs holding at most ``budget`` keys
    in memory at a time."""

    def __init__(
        self,
        folder: str,
        pairs: Iterable[tuple[np.ndarray, np.ndarray]],
        counts: tuple[int, int],
        budget: int,
        chunk_size: int,
    ) -> None:
        self.paths = (os.path.join(folder, "positive"), os.path.join(folder, "negative"))
        self.budget, self.chunk_size = budget, chunk_size
        self.hist = np.zeros((2, 1 << _PREFIX_BITS), dtype=np.int64)
        self.buffer: np.ndarray | None = None
        written = [0, 0]
        score_dtype = None
        with open(self.paths[0], "wb") as pos_file, open(self.paths[1], "wb") as neg_file:
            for s, lab in pairs:
                if score_dtype is None:
                    score_dtype = self._dtypes(s.dtype)
                for start in range(0, s.size, _SPILL_PIECE):
                    piece = s[start : start + _SPILL_PIECE].astype(score_dtype, copy=False)
                    if piece.dtype.kind == "f" and np.isnan(piece).any():
                        raise ConfigError(_NAN_SCORES)
                    keys, is_pos = _sort_keys(piece), lab[start : start + _SPILL_PIECE]
                    for c, (file, part) in enumerate(((pos_file, keys[is_pos]), (neg_file, keys[~is_pos]))):
                        written[c] += part.size
                        if written[c] > counts[c]:
                            raise ConfigError(f"the chunks hold more scores than class_counts={counts} says.")
                        part.tofile(file)
                        self.hist[c] += np.bincount((part >> self.shift).astype(np.intp), minlength=1 << _PREFIX_BITS)
        if tuple(written) != tuple(counts):
            raise ConfigError(_counts_differ(*written, counts))

    def _dtypes(self, dtype: np.dtype) -> np.dtype:
        """The scores' dtype as keyed (1-byte scores widen to 2: the top 16 bits must exist); sets the keys'."""
        if dtype.kind not in "fiub" or dtype.itemsize > 8:
            raise ConfigError(f"exact_auc spills real or integer scores; got {dtype}.")
        if dtype.itemsize == 1:
            dtype = np.dtype("i2" if dtype.kind == "i" else "u2")
        self.key_dtype = np.dtype(f"u{dtype.itemsize}")
        self.shift = 8 * dtype.itemsize - _PREFIX_BITS
        return dtype

    def twice_wins(self) -> int:
        """2·(#{pos > neg} + ½·#{pos = neg}) over every pair."""
        return self._twice_wins(self.hist[0], self.hist[1], self.shift, 0)

    def _twice_wins(self, pos: np.ndarray, neg: np.ndarray, shift: int, prefix: int) -> int:
        """The same over the keys whose bits above ``shift + 16`` are ``prefix``, binned by their next 16 bits
        (``key >> shift``) into ``pos`` and ``neg``. A bin of one value is all ties; bins that fit in the budget are
        read back a run at a time and counted sorted; a bin that does not is binned again by its next 16 bits."""
        base = prefix << _PREFIX_BITS
        below = np.concatenate(([0], np.cumsum(neg)[:-1]))  # the negatives in lower bins lose to the bin's positives
        if shift == 0:  # every bin is one key: its pairs tie
            return sum(p * (2 * b + n) for p, b, n in zip(pos.tolist(), below.tolist(), neg.tolist()) if p)
        total, run = 0, None  # run: [first bin, end bin) not yet counted, and the keys it holds
        for b in [*np.flatnonzero(pos + neg).tolist(), None]:  # None closes the last run
            size = 0 if b is None else int(pos[b] + neg[b])
            if run is not None and (b is None or run[2] + size > self.budget):
                first, end, _ = run
                total += self._run(base + first, base + end, shift, pos[first:end].sum(), neg[first:end].sum())
                total += 2 * int(below[first]) * int(pos[first:end].sum())
                run = None
            if b is None:
                break
            if size <= self.budget:
                run = (b, b + 1, size) if run is None else (run[0], b + 1, run[2] + size)
                continue
            sub = np.zeros((2, 1 << _PREFIX_BITS), dtype=np.int64)  # one bin beyond the budget: its next bits
            for c in range(2):
                for keys in _read_keys(self.paths[c], self.key_dtype):
                    keys = keys[(keys >> shift) == base + b]
                    low = (keys >> (shift - _PREFIX_BITS)) & ((1 << _PREFIX_BITS) - 1)
                    sub[c] += np.bincount(low.astype(np.intp), minlength=1 << _PREFIX_BITS)
            total += 2 * int(below[b]) * int(pos[b])
            total += self._twice_wins(sub[0], sub[1], shift - _PREFIX_BITS, base + b)
        return total

    def _run(self, lo: int, hi: int, shift: int, n_pos: int, n_neg: int) -> int:
        """Twice the wins among the keys with ``lo <= key >> shift < hi``, read back into one buffer and sorted."""
        n_pos, n_neg = int(n_pos), int(n_neg)
        if self.buffer is None:
            self.buffer = np.empty(self.budget, dtype=self.key_dtype)
        first, span = lo << shift, (hi - lo) << shift  # the run's keys: 0 <= key − first < span (unsigned)
        at = 0
        for path in self.paths:
            for keys in _read_keys(path, self.key_dtype):
                if span >> (8 * keys.itemsize):  # the run holds every key
                    picked = keys
                else:
                    picked = keys[np.subtract(keys, keys.dtype.type(first)) < keys.dtype.type(span)]
                self.buffer[at : at + picked.size] = picked
                at += picked.size
        pos, neg = self.buffer[:n_pos], self.buffer[n_pos : n_pos + n_neg]
        pos.sort()
        neg.sort()
        return _twice_wins_sorted(pos, neg, self.chunk_size)


def quantile_rank(x: torch.Tensor, chunk_size: int = 1 << 20) -> torch.Tensor:
    """Rank of each element within ``x`` scaled to [0, 1]; tied elements share their average rank. Shape of ``x``.

    One sort, then the ranks are written ``chunk_size`` sorted positions at a time: a run of equal values
    ``[start, end)`` gets ``(start + end − 1) / 2``, so an untied value gets its position. The chunk's runs come from
    ``unique_consecutive``; only its first and last run can reach past its ends, and ``searchsorted`` finds where
    they start and stop. Memory: the sorted values, the sort order and the result (16 bytes a weight) plus one
    chunk, with no full-size float64 or inverse-index temporary.
    """
    flat = x.reshape(-1)
    n = flat.numel()
    if n <= 1:
        return torch.zeros_like(x, dtype=torch.float32)
    sorted_vals, order = flat.sort()
    ranks = torch.empty(n, dtype=torch.float32)
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        values = sorted_vals[start:stop]
        _, run_of, counts = torch.unique_consecutive(values, return_inverse=True, return_counts=True)
        ends = counts.cumsum(0).add_(start)  # where each run stops, as a position in sorted_vals
        starts = ends - counts
        starts[0] = int(torch.searchsorted(sorted_vals, values[:1], side="left"))  # the first run may begin earlier
        ends[-1] = int(torch.searchsorted(sorted_vals, values[-1:], side="right"))  # the last may end later
        if counts.numel() == stop - start and starts[0] == start and ends[-1] == stop:
            rank = torch.arange(start, stop, dtype=torch.float64)  # no tie: the rank is the position
        else:
            rank = (starts + ends - 1).to(torch.float64).div_(2.0)[run_of]  # average 0-based rank of the run
        ranks.scatter_(0, order[start:stop], rank.div_(n - 1).to(torch.float32))
    return ranks.view_as(x)


def layer_component(name: str) -> str:
    """The (layer, component) key of a parameter: its owning module's name (``...layers.3.mlp.down_proj``)."""
    return _SUFFIX.sub("", name)


def feature_families(with_control: bool) -> tuple[str, ...]:
    """Names of the per-weight families evaluated (contrast only with an UnMask control)."""
    return MAGNITUDE_FAMILIES + REVERSAL_FAMILIES + (CONTRAST_FAMILIES if with_control else ())


def weight_features(
    family: str,
    pre: torch.Tensor | None,
    inj: torch.Tensor,
    unl: torch.Tensor,
    control_delta: torch.Tensor | None = None,
    component_std: float = 1.0,
    eps: float = 1e-12,
) -> torch.Tensor:
    """One family's per-weight score for one tensor, float32 of the tensor's shape (see the module docstring).

    ``pre`` is read by the reversal families only and ``control_delta`` by the contrast families only; the others
    accept ``None``.
    """
    # In-place where a result is fresh: at most three tensor-sized temporaries, the same arithmetic as out of place.
    inj, unl = inj.float(), unl.float()
    if family in MAGNITUDE_FAMILIES:
        magnitude = torch.sub(unl, inj).abs_()
        if family == "raw":
            return magnitude
        if family == "qtile":
            return quantile_rank(magnitude)
        return magnitude.div_(component_std + eps)  # layernorm
    if family in REVERSAL_FAMILIES:
        if pre is None:
            raise ConfigError(f"family {family!r} needs θ_pre; pass `pre`.")
        pre = pre.float()
        d_inj = inj - pre
        if family == "signrev":
            return torch.sub(unl, inj).mul_(d_inj).neg_()
        if family == "reversal":
            d_inj.abs_()
            distance = torch.sub(unl, pre).abs_()  # |θ_unl − θ_pre|
            return torch.sub(d_inj, distance, out=distance).div_(d_inj.add_(eps))
        direction = torch.sign(d_inj)  # dirreversal
        return torch.sub(unl, inj).mul_(direction).neg_().div_(d_inj.abs_().add_(eps))
    if family not in CONTRAST_FAMILIES:
        raise ConfigError(f"unknown mask-AUC family {family!r}; choose from {feature_families(True)}.")
    if control_delta is None:
        raise ConfigError(f"family {family!r} needs the UnMask control's weight change; pass `control`.")
    a, b = torch.sub(unl, inj).abs_(), control_delta.float().abs()
    if family == "contrast":
        return a.sub_(b)
    if family == "contrastnorm":
        return torch.sub(a, b).div_(a.add_(b).add_(eps))
    return a.div_(b.add_(eps))  # compnorm


def _add_moments(moments: list, inj: torch.Tensor, unl: torch.Tensor, piece: int = 1 << 20) -> None:
    # Running [count, Σd, Σd²] of d = Δ_unl in float64, in pieces so no tensor-sized float64 copy is made.
    a, b = inj.reshape(-1), unl.reshape(-1)
    for s in range(0, a.numel(), piece):
        d = b[s : s + piece].double() - a[s : s + piece].double()
        moments[0] += d.numel()
        moments[1] += float(d.sum())
        moments[2] += float((d * d).sum())


def _pooled_std(count: int, s1: float, s2: float) -> float:
    return math.sqrt(max((s2 - s1 * s1 / count) / max(count - 1, 1), 0.0))


class _ControlDelta(Mapping):
    """Δ_unmask = θ_unl − θ_inj of the UnMask control, made in float32 one tensor at a time (never cached)."""

    def __init__(self, inj: Mapping[str, torch.Tensor], unl: Mapping[str, torch.Tensor]) -> None:
        self.inj, self.unl = inj, unl
        self.shapes = {n: mask_shape(unl, n) for n in unl}

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.unl[name].float() - self.inj[name].float()

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL("libc.so.6"), "malloc_trim", None)
    except OSError:  # not glibc (musl has no malloc_trim)
        return None


def _return_free_heap() -> None:
    """Give freed heap memory back to the OS (glibc; a no-op elsewhere).

    glibc keeps freed blocks under its adaptive mmap threshold (up to 32 MiB) in the heap, and the per-tensor
    temporaries are that size: measured on 3e7 weights in 3e6-weight tensors, the free but resident heap grew by
    0.3-0.5 GiB over the passes, on top of the score buffer. Trimming once per tensor keeps it near one tensor's.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _weights(source: WeightSource) -> Mapping[str, torch.Tensor]:
    """A mapping as is; a path as its :class:`~lightning_unlearn.models.LazyWeights` (tensors read on access)."""
    if isinstance(source, (str, os.PathLike)):
        from lightning_unlearn.models import load_weights

        return load_weights(source, lazy=True)
    return source


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
    """AUC of out-of-fold logistic-regression probabilities over standardized ``features`` ``(n, F)``.

    What ``cross_val_predict`` of a ``StandardScaler`` + ``LogisticRegression`` pipeline returns, fold by fold in
    a loop that standardizes each fold's copy of the features in place, scored by :func:`exact_auc` (sklearn's
    ``roc_auc_score`` up to the final division's rounding, in a quarter of its memory): at 2M weights, about half the
    memory of the pipeline under ``cross_val_predict`` and ``roc_auc_score``.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    labels = labels.astype(bool)
    if labels.sum() < folds or (~labels).sum() < folds:
        return math.nan
    proba = np.empty(len(labels))
    for train, test in StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed).split(features, labels):
        clf = make_pipeline(StandardScaler(copy=False), LogisticRegression(max_iter=1000))  # scales the copies
        clf.fit(features[train], labels[train])
        proba[test] = clf.predict_proba(features[test])[:, 1]
    return exact_auc([(proba, labels)])


@dataclass
class _Inputs:
    """The weights one :func:`mask_auc` call scores, read tensor by tensor, and each layer component's std of Δ_unl
    (set by :func:`_pre_pass`)."""

    pre: Mapping[str, torch.Tensor]
    inj: Mapping[str, torch.Tensor]
    unl: Mapping[str, torch.Tensor]
    control_delta: Mapping[str, torch.Tensor] | None
    names: list[str]
    eps: float
    stds: dict[str, float] = field(default_factory=dict)

    def feature(self, family: str, n: str) -> torch.Tensor:
        """One family's scores of parameter ``n``."""
        return weight_features(
            family,
            self.pre[n] if family in REVERSAL_FAMILIES else None,
            self.inj[n],
            self.unl[n],
            self.control_delta[n] if family in CONTRAST_FAMILIES else None,
            self.stds[layer_component(n)],
            self.eps,
        )

    def stream(
        self,
        family: str,
        labels: Mapping[str, torch.Tensor],
        idx: list[torch.Tensor] | None,
        columns: dict[str, list[torch.Tensor]],
        bar,
    ) -> Iterator[tuple]:
        """``(scores, labels)`` per parameter, one tensor in memory at a time; with ``idx``, the composite's
        subsample of the scores goes to ``columns[family]``."""
        if idx is not None:
            columns[family] = []
        for i, n in enumerate(self.names):
            _return_free_heap()
            scores = self.feature(family, n)
            if idx is not None:
                columns[family].append(scores.reshape(-1)[idx[i]])
            yield scores, labels[n]
            bar.update()


def _read_inputs(
    theta_pre: WeightSource,
    theta_inj: WeightSource,
    theta_unl: WeightSource,
    label_mask: Mapping[str, torch.Tensor],
    control: ControlSource | None,
    unified_mask: Mapping[str, torch.Tensor] | None,
    names: Sequence[str] | None,
    eps: float,
) -> _Inputs:
    """Open every source and check that each holds every evaluated parameter, in θ_unl's shape."""
    pre, inj, unl = _weights(theta_pre), _weights(theta_inj), _weights(theta_unl)
    sources = [("theta_pre", pre), ("theta_inj", inj), ("theta_unl", unl), ("label_mask", label_mask)]
    control_delta = None
    if isinstance(control, (tuple, list)):
        if len(control) != 2:
            raise ConfigError(f"control is a pair (control θ_inj, control θ_unl); got {len(control)} items.")
        c_inj, c_unl = _weights(control[0]), _weights(control[1])
        sources += [("control θ_inj", c_inj), ("control θ_unl", c_unl)]
        control_delta = _ControlDelta(c_inj, c_unl)
    elif control is not None:
        control_delta = control
        sources.append(("control", control))
    if unified_mask is not None:
        sources.append(("unified_mask", unified_mask))
    names = list(label_mask) if names is None else list(names)
    if not names:
        raise ConfigError("mask_auc got no parameters to evaluate; pass `names` or a non-empty label_mask.")
    for n in names:
        for what, d in sources:
            if n not in d:
                raise ConfigError(f"parameter {n!r} is missing from {what}; all inputs must share the same names.")
            if mask_shape(d, n) != mask_shape(unl, n):
                raise ConfigError(f"{what}[{n!r}] has shape {mask_shape(d, n)}, expected {mask_shape(unl, n)}.")
    return _Inputs(pre, inj, unl, control_delta, names, eps)


def _pre_pass(
    inputs: _Inputs, labels_by_key: Mapping[str, Mapping[str, torch.Tensor]], idx: list[torch.Tensor] | None, bar
) -> tuple[int, dict[str, int], dict[str, list[torch.Tensor]]]:
    """Every tensor once: sets each layer component's std of Δ_unl; returns the weights Δ_inj leaves unchanged,
    the positives per label and the composite's subsampled labels."""
    moments: dict[str, list] = {}  # (layer, component) -> [count, Σ Δ_unl, Σ Δ_unl²]
    unchanged = 0
    num_positive = dict.fromkeys(labels_by_key, 0)
    sampled_labels: dict[str, list[torch.Tensor]] = {key: [] for key in labels_by_key}
    for i, n in enumerate(inputs.names):
        _return_free_heap()
        t_inj, t_unl = inputs.inj[n], inputs.unl[n]
        unchanged += int((t_inj == inputs.pre[n]).sum())
        _add_moments(moments.setdefault(layer_component(n), [0, 0.0, 0.0]), t_inj, t_unl)
        for key, labels in labels_by_key.items():
            lab = labels[n].bool()
            num_positive[key] += int(lab.sum())
            if idx is not None:
                sampled_labels[key].append(lab.reshape(-1)[idx[i]])
        del t_inj, t_unl
        bar.update()
    inputs.stds = {key: _pooled_std(*m) for key, m in moments.items()}
    return unchanged, num_positive, sampled_labels


def _sparse_injection_omissions(result: dict, unchanged: float, families: Sequence[str]) -> list[str]:
    """Record in ``result`` the families a sparse injection (Δ_inj exactly 0 on more than
    :data:`UNCHANGED_FRACTION_LIMIT` of the weights) leaves out of the max and the composite, and the warning that
    says so; returns the composite's families."""
    result["inj_unchanged_fraction"] = unchanged
    result["omitted"] = list(SPARSE_INJECTION_OMITTED) if unchanged > UNCHANGED_FRACTION_LIMIT else []
    if result["omitted"]:
        result["warnings"].append(
            f"Δ_inj is exactly 0 on {unchanged:.1%} of the weights (the injection moved only masked elements, e.g. "
            "no neutral text), so the reversal family `reversal` finds the injection masks from Δ_inj alone (noise "
            "scores above 0.5: every unchanged weight ranks below every masked one); it is left out of the max and "
            "the composite. signrev and dirreversal stay in the max (noise scores 0.5 on them) but not in the "
            "composite. Inject with neutral text, as the paper does, to score `reversal` too."
        )
    scored = [f for f in families if f not in result["omitted"]]
    # On a sparse injection signrev and dirreversal are exactly 0 off the masks and odd in Δ_unl on them: alone they
    # score chance on noise, but a linear classifier that weighs them with the magnitude families (whose sizes they
    # share) does not (0.48-0.54 on pure noise, 450k weights), so the composite leaves them out there.
    result["composite_features"] = [f for f in scored if not (result["omitted"] and f in REVERSAL_FAMILIES)]
    return result["composite_features"]


def _add_maxima(result: dict, keys: Iterable[str]) -> None:
    """Each label's max AUC over the families not omitted, and the family that reached it."""
    for key in keys:
        finite = {
            f: v for f, v in result[key].items()
            if isinstance(v, float) and not math.isnan(v) and f not in result["omitted"]
        }  # fmt: skip
        best = max(finite, key=finite.get) if finite else None
        result[key]["max"] = finite[best] if best else math.nan
        result[key]["best"] = best


def buffer_bytes(buffer_mib: float | None) -> int | None:
    """``buffer_mib`` in bytes, checked: a positive size, or ``None`` (hold every score)."""
    if buffer_mib is None:
        return None
    if isinstance(buffer_mib, bool) or not isinstance(buffer_mib, (int, float)) or not buffer_mib > 0:
        raise ConfigError(
            f"buffer_mib={buffer_mib!r}: pass a positive size in MiB, or None (null in YAML or on the command line) "
            "to hold every score."
        )
    return max(int(buffer_mib * 2**20), 1)


def mask_auc(
    theta_pre: WeightSource,
    theta_inj: WeightSource,
    theta_unl: WeightSource,
    label_mask: Mapping[str, torch.Tensor],
    control: ControlSource | None = None,
    unified_mask: Mapping[str, torch.Tensor] | None = None,
    names: Sequence[str] | None = None,
    max_samples: int = 2_000_000,
    folds: int = 5,
    seed: int = 0,
    eps: float = 1e-12,
    composite: bool = True,
    progress: str | None = None,
    buffer_mib: float | None = 256,
    spill_dir: str | os.PathLike | None = None,
) -> dict:
    """Every family's ROC AUC of the weight change against the forget mask, and the max.

    The weights are read one tensor at a time, so with model directories (or any lazy mappings, such as
    ``masks.union_mask(load_masks(path, lazy=True)[0], groups, lazy=True)`` for the labels) no model is ever
    whole in memory: one pre-pass reads θ_pre, θ_inj, θ_unl and the labels (Δ_inj's unchanged share, each
    component's std of Δ_unl, class counts, the composite's labels), then each (label, family) pass reads the
    tensors that family needs, scores them into :func:`exact_auc`'s class buffers and drops them (the composite's
    subsample is taken on the way). Peak memory is a few tensors plus the scores of all weights once (4 bytes a
    weight) or, when those exceed ``buffer_mib``, that much: the scores then spill to a temporary directory and
    are counted a key range at a time (:func:`exact_auc`; the same AUC, with more reading). In-memory dicts take the
    same path.

    Args:
        theta_pre: pretrained weights θ_pre: ``{name: tensor}``, or a ``.safetensors`` file or model directory
            (``model.safetensors`` or sharded ``model-0000i-of-0000n.safetensors``; names canonicalized as
            ``models.load_weights`` does), read tensor by tensor.
        theta_inj: weights after injection θ_inj (a mapping or a path, as ``theta_pre``).
        theta_unl: weights after unlearning θ_unl (a mapping or a path).
        label_mask: ``{name: bool tensor}`` ground truth m^F (``masks.union_mask(packed, forget_groups)``).
        control: the UnMask control, for the contrast families: ``{name: Δ_unmask}``, the same method's weight
            change (θ_unl − θ_inj) on the control run, or the pair ``(control θ_inj, control θ_unl)`` (mappings or
            paths; Δ_unmask is made per tensor in float32). ``None`` omits the contrast families (e.g. OracleGrad,
            whose control is undefined).
        unified_mask: ``{name: bool tensor}`` m^F ∨ m^R; when given, every AUC is also reported against it.
        names: parameters evaluated; default: every name of ``label_mask`` (pass θ_mask's names, e.g.
            ``masks.masked_parameter_names(model)``, to leave out embeddings, norms and unmasked blocks).
        max_samples: weights subsampled for the composite classifier (the paper uses 2M).
        folds: cross-validation folds of the composite.
        seed: subsample and fold seed.
        eps: ε of the ratio features.
        composite: fit the composite classifier.
        progress: the label of a progress bar over the tensor reads (stderr), ``None`` for none.
        buffer_mib: the most MiB of scores held in memory for one AUC; ``None``: all of them (no spill).
        spill_dir: where scores beyond ``buffer_mib`` spill (a temporary directory in it; default ``$TMPDIR``): it
            needs 4 bytes a weight free.

    Returns:
        ``{"F": {family: auc, ..., "composite": auc, "max": auc, "best": family}, "F|R": {...} (with
        unified_mask), "num_weights": int, "num_positive": {"F": int, ...}, "num_subsampled": int,
        "inj_unchanged_fraction": share of weights with Δ_inj exactly 0, "omitted": families left out of the max
        and the composite, "composite_features": the families the composite is fitted on, "warnings": [str, ...]}``.
    """
    max_buffer = buffer_bytes(buffer_mib)
    inputs = _read_inputs(theta_pre, theta_inj, theta_unl, label_mask, control, unified_mask, names, eps)
    families = feature_families(inputs.control_delta is not None)
    labels_by_key = {"F": label_mask} | ({"F|R": unified_mask} if unified_mask is not None else {})
    sizes = [math.prod(mask_shape(inputs.unl, n)) for n in inputs.names]
    idx = _subsample_indices(sizes, max_samples, seed) if composite else None
    bar = _progress_bar(progress, (1 + len(labels_by_key) * len(families)) * len(inputs.names))
    unchanged, num_positive, sampled_labels = _pre_pass(inputs, labels_by_key, idx, bar)

    num_weights = sum(sizes)
    result: dict = {"num_weights": num_weights, "num_positive": num_positive, "warnings": []}
    composite_features = _sparse_injection_omissions(result, unchanged / max(num_weights, 1), families)
    columns: dict[str, list[torch.Tensor]] = {}  # the composite's subsampled scores, per family
    for k, (key, labels) in enumerate(labels_by_key.items()):
        counts = (num_positive[key], num_weights - num_positive[key])
        result[key] = {}
        for f in families:
            sample = idx is not None and k == 0 and f in composite_features
            started = time.perf_counter()
            chunks = functools.partial(inputs.stream, f, labels, idx if sample else None, columns, bar)
            result[key][f] = exact_auc(chunks, class_counts=counts, max_buffer_bytes=max_buffer, spill_dir=spill_dir)
            log.debug("mask AUC(%s) %s = %.4f in %.1f s", key, f, result[key][f], time.perf_counter() - started)
    bar.close()

    if idx is not None:
        _return_free_heap()  # the AUC passes' freed pieces, before the classifier's copies
        x = np.empty((sum(len(i) for i in idx), len(composite_features)))  # filled a column at a time
        for j, f in enumerate(composite_features):
            x[:, j] = torch.cat(columns.pop(f)).numpy()
        result["num_subsampled"] = int(x.shape[0])
        for key in labels_by_key:
            y = torch.cat(sampled_labels[key]).numpy()
            result[key]["composite"] = composite_auc(x, y, folds, seed)
    _add_maxima(result, labels_by_key)
    return result


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(label: str | None, total: int):
    if label is None:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=label, unit="tensor", leave=False)
