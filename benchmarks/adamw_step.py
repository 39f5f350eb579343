"""One AdamW step over a model's parameters: torch's per-tensor loop (its CPU default), ``foreach`` and ``fused``.

What ``OptimizerConfig(fused=True)`` buys. The parameters have the shapes of a SmolLM2-style Llama (hidden 576,
MLP 1536, 9 query and 3 key/value heads of 64): ``--blocks 6 --vocab 10268`` is the Lacuna testbed's θ_pre
(27.2 M parameters), ``--blocks 30 --vocab 49152`` SmolLM2-135M itself. Every method steps its own copy of the same
parameters with the same gradients, the methods taking turns step by step, so they see the same minutes of a shared
machine; after the warm-up each method's step times are summarised by their median. ``max_abs_diff`` is the largest
difference of a parameter from the loop's after every timed step (the fused kernel rounds differently).

    python benchmarks/adamw_step.py                              # both sizes, 10 timed steps each
    python benchmarks/adamw_step.py --sizes 6:10268 --steps 20 --threads 2

Prints one JSON object per size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

METHODS = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def llama_shapes(blocks: int, vocab: int, hidden: int = 576, mlp: int = 1536, kv: int = 192) -> list[tuple[int, ...]]:
    """Parameter shapes of a Llama with tied embeddings (norm scales included)."""
    block = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (mlp, hidden), (mlp, hidden)]
    block += [(hidden, mlp), (hidden,), (hidden,)]
    return [(vocab, hidden), (hidden,)] + block * blocks


def run(blocks: int, vocab: int, steps: int, warmup: int) -> dict:
    shapes = llama_shapes(blocks, vocab)
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=gen) * 0.02 for s in shapes]
    params = {m: [torch.nn.Parameter(t.clone()) for t in start] for m in METHODS}
    optims = {m: torch.optim.AdamW(params[m], lr=2e-3, weight_decay=0.0, **kw) for m, kw in METHODS.items()}
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    diff = {m: 0.0 for m in METHODS}
    for step in range(warmup + steps):
        grads = [torch.randn(s, generator=gen) * 1e-3 for s in shapes]
        order = list(METHODS) if step % 2 == 0 else list(reversed(METHODS))  # who goes first turns round
        for m in order:
            for p, g in zip(params[m], grads, strict=True):
                p.grad = g.clone()
            t = time.perf_counter()
            optims[m].step()
            if step >= warmup:
                times[m].append(time.perf_counter() - t)
        with torch.no_grad():
            for m in METHODS:
                d = max(float((a - b).abs().max()) for a, b in zip(params[m], params["loop"], strict=True))
                diff[m] = max(diff[m], d)
    loop_ms = statistics.median(times["loop"]) * 1e3
    out = {"blocks": blocks, "vocab": vocab, "params_m": round(sum(torch.Size(s).numel() for s in shapes) / 1e6, 2)}
    for m in METHODS:
        ms = statistics.median(times[m]) * 1e3
        out[m] = {"median_ms": round(ms, 2), "vs_loop": round(ms / loop_ms, 3), "max_abs_diff": diff[m]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["6:10268", "30:49152"], help="blocks:vocab pairs")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for size in args.sizes:
        blocks, vocab = (int(x) for x in size.split(":"))
        print(json.dumps({"threads": torch.get_num_threads(), **run(blocks, vocab, args.steps, args.warmup)}))


if __name__ == "__main__":
    main()
