"""Time the exact, bounded-memory mask AUC on many weights and report peak RSS as JSON.

    .venv/bin/python benchmarks/mask_auc.py --weights 100000000 --tensors 50

Weights are split into ``--tensors`` equally sized score tensors (like a model's parameters); 15% are positive
(m^F of three 5% groups). The score vectors are generated up front (they stand in for the model's weights that
already live in memory); the report separates that baseline RSS from the peak reached while computing the AUC.
With ``--check`` a subsample is cross-checked against scikit-learn.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import psutil
import torch

from lightning_unlearn.metrics.mask_auc import exact_auc


def _rss_gib() -> float:
    return psutil.Process().memory_info().rss / 2**30


def _peak_rss_gib() -> float:
    scale = 2**30 if sys.platform == "darwin" else 2**20  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=int, default=100_000_000)
    ap.add_argument("--tensors", type=int, default=50)
    ap.add_argument("--positive-rate", type=float, default=0.15)
    ap.add_argument("--chunk-size", type=int, default=1 << 22)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--check", type=int, default=0, help="cross-check this many leading weights with sklearn")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    per = args.weights // args.tensors
    scores, labels = [], []
    for _ in range(args.tensors):
        y = torch.rand(per, generator=g) < args.positive_rate
        scores.append(torch.randn(per, generator=g) + 0.3 * y)
        labels.append(y)
    baseline = _rss_gib()
    peak_before = _peak_rss_gib()
    t0 = time.perf_counter()
    auc = exact_auc(list(zip(scores, labels)), chunk_size=args.chunk_size)
    seconds = time.perf_counter() - t0
    peak = _peak_rss_gib()
    out = {
        "weights": per * args.tensors,
        "tensors": args.tensors,
        "auc": auc,
        "seconds": round(seconds, 2),
        "weights_per_second": round(per * args.tensors / seconds),
        "input_bytes_gib": round(per * args.tensors * 5 / 2**30, 3),  # float32 scores + bool labels
        "rss_before_gib": round(baseline, 3),
        "peak_rss_gib": round(max(peak, peak_before), 3),
        "peak_rss_over_inputs_gib": round(max(peak, peak_before) - baseline, 3),
        "threads": args.threads,
    }
    if args.check:
        from sklearn.metrics import roc_auc_score

        s = torch.cat(scores)[: args.check]
        y = torch.cat(labels)[: args.check]
        out["check_abs_diff"] = abs(exact_auc([(s, y)]) - roc_auc_score(y.numpy(), s.numpy()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
