"""Step time of exact per-sample masked gradients vs an unmasked step (forward + backward + SGD step).

Prints one JSON object per (model size, method). Methods: ``one_pass`` (custom autograd rules, the default of the
single-device and DDP strategies), ``lockstep`` (one forward+backward per group present, what FSDP runs) and
``microbatch1`` (the paper's Algorithm 1 reference loop, the baseline). Models are randomly initialised Llamas
with a 2048-token vocabulary; the batch holds all 7 group ids (-1 and 0..5) and trains on every token.

    python benchmarks/masked_step.py                      # hidden 512 / 4 layers and hidden 128, batch 8x128
    python benchmarks/masked_step.py --hidden 512 --methods one_pass --reps 5

``step_ms_*`` are median wall-clock times, ``cpu_ms_*`` median process CPU times (robust when other jobs share the
cores). ``peak_rss_mb`` is the process's peak resident memory after the row (it only grows).
``mask_bytes_per_param`` is what masking stores per parameter element: the packed uint32 (4 bytes) plus, for
``one_pass``, its int32 index cache of the masked elements (averaged over all parameters).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import torch

from lightning_unlearn.masks import sample_masks
from lightning_unlearn.strategies import MaskedGradients, lockstep_masked_backward, microbatch_masked_gradients

GROUP_IDS = [-1, 0, 1, 2, 3, 4, 5, -1]
VOCAB = 2048


def build(hidden: int, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=int(round(hidden * 8 / 3 / 16)) * 16,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 2),
        num_key_value_heads=max(hidden // 64, 2),
        max_position_embeddings=1024,
    )
    return LlamaForCausalLM(cfg)


def mean_loss(model, batch) -> torch.Tensor:
    # mean over samples of per-sample mean token NLL (the strategies' loss contract)
    logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB).float(), batch["input_ids"][:, 1:].reshape(-1), reduction="none"
    )
    return nll.view(batch["input_ids"].shape[0], -1).mean(1).mean()


def timed(plain, masked, reps: int, warmup: int) -> tuple[float, float, float, float]:
    """Median wall-clock and process-CPU milliseconds per step of ``plain`` and ``masked``, run alternately so both
    see the same machine load (CPU time is also robust to other jobs sharing the cores)."""
    for _ in range(warmup):
        plain()
        masked()
    samples: dict[str, list[tuple[float, float]]] = {"plain": [], "masked": []}
    for _ in range(reps):
        for key, step in (("plain", plain), ("masked", masked)):
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            samples[key].append((time.perf_counter() - t0, time.process_time() - c0))

    def med(key: str, i: int) -> float:
        return 1000 * statistics.median(s[i] for s in samples[key])

    return med("plain", 0), med("masked", 0), med("plain", 1), med("masked", 1)


def run(hidden: int, layers: int, batch_size: int, seq: int, methods: list[str], reps: int, warmup: int) -> None:
    model = build(hidden, layers)
    masks = sample_masks(model, num_groups=6, coverage=0.05, seed=0)
    gen = torch.Generator().manual_seed(0)
    group_ids = torch.tensor((GROUP_IDS * batch_size)[:batch_size])
    batch = {"input_ids": torch.randint(0, VOCAB, (batch_size, seq), generator=gen), "group_ids": group_ids}
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    engine = MaskedGradients(model, masks)
    param_masks = engine.param_masks()
    n_params = sum(p.numel() for p in model.parameters())

    def unmasked():
        opt.zero_grad(set_to_none=True)
        mean_loss(model, batch).backward()
        opt.step()

    def one_pass():
        opt.zero_grad(set_to_none=True)
        with engine.batch(group_ids):
            loss = mean_loss(model, batch)
        loss.backward()
        opt.step()

    def lockstep():
        opt.zero_grad(set_to_none=True)
        lockstep_masked_backward(lambda b: mean_loss(model, b), torch.Tensor.backward, batch, group_ids, param_masks)
        opt.step()

    def microbatch1():
        microbatch_masked_gradients(model, masks, batch, group_ids, mean_loss)
        opt.step()

    steps = {"one_pass": one_pass, "lockstep": lockstep, "microbatch1": microbatch1}
    for method in methods:
        t_plain, t_masked, c_plain, c_masked = timed(unmasked, steps[method], reps, warmup)
        cache = engine.cache_bytes if method == "one_pass" else 0
        row = {
            "method": method,
            "hidden": hidden,
            "layers": layers,
            "vocab": VOCAB,
            "threads": torch.get_num_threads(),
            "batch": batch_size,
            "seq": seq,
            "groups_present": sorted(set(group_ids.tolist())),
            "step_ms_unmasked": round(t_plain, 1),
            "step_ms_masked": round(t_masked, 1),
            "ratio": round(t_masked / t_plain, 3),
            "cpu_ms_unmasked": round(c_plain, 1),
            "cpu_ms_masked": round(c_masked, 1),
            "cpu_ratio": round(c_masked / c_plain, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "mask_bytes_per_param": round((4 * n_params + cache) / n_params, 3),
        }
        print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, nargs="+", default=[512, 128])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--methods", nargs="+", default=["one_pass", "lockstep", "microbatch1"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for hidden in args.hidden:
        run(hidden, args.layers, args.batch, args.seq, args.methods, args.reps, args.warmup)


if __name__ == "__main__":
    main()
