"""Step time of exact per-sample masked gradients vs an unmasked step (forward + backward + SGD step).

Prints one JSON object per (model size, method). Methods: ``one_pass`` (custom autograd rules, the default of every
masked strategy), ``lockstep`` (one forward+backward per group present, the fallback for modules without a one-pass
rule) and ``microbatch1`` (the paper's Algorithm 1 reference loop, the baseline). Models are randomly initialised Llamas
with a 2048-token vocabulary; the batch holds all 7 group ids (-1 and 0..5) and trains on every token.

    python benchmarks/masked_step.py                      # hidden 512 / 4 layers and hidden 128, batch 8x128
    python benchmarks/masked_step.py --hidden 512 --methods one_pass --reps 5
    python benchmarks/masked_step.py --strategy fsdp --ranks 2 --reps 7   # the real strategy through Lightning
    python benchmarks/masked_step.py --strategy fsdp --ranks 2 --reps 7 --methods one_pass one_pass_gather_on_use

``one_pass_gather_on_use`` (FSDP2 only) is one pass with each full mask gathered when its backward needs it, the
engine before each backward started the next one's gather (``MaskedGradients.prefetch``): the two side by side.

With ``--strategy {single,ddp,fsdp}`` each method runs the real Lightning strategy (``MaskedSingleDeviceStrategy``,
``MaskedDDPStrategy``, ``MaskedFSDPStrategy``) in a ``Trainer.fit`` on gloo with ``--ranks`` processes of one torch
thread each; every rank's batch is ``--batch`` × ``--seq`` with all 7 group ids. Masked and unmasked steps of the
same strategy alternate in one fit (an unmasked step is the same batch without ``group_ids``), so both see the same
load; ``step_ms_*`` are rank 0's medians of ``--reps`` steps each, after ``--warmup`` pairs. Per rank it reports
the packed-mask bytes it keeps (``mask_bytes_persistent``, plus the index cache of the single-device/DDP engine)
and the largest full mask it gathered during a backward (``mask_bytes_transient_peak``: FSDP one pass gathers one
parameter's mask at a time, with the next one's gather in flight beside it, so at most two are held at once; lockstep
masks the reduced shards with the local shard).

``step_ms_*`` are median wall-clock times, ``cpu_ms_*`` median process CPU times (robust when other jobs share the
cores). ``peak_rss_mb`` is the process's peak resident memory after the row (it only grows).
``mask_bytes_per_param`` is what masking stores per parameter element: the packed uint32 (4 bytes) plus, for
``one_pass``, its int32 index cache of the masked elements (averaged over all parameters).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
        if method not in steps:
            raise SystemExit(f"--methods {method}: one process runs {sorted(steps)}; it needs --strategy fsdp.")
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


def _strategy(name: str, method: str):
    from lightning_unlearn.strategies import MaskedDDPStrategy, MaskedFSDPStrategy, MaskedSingleDeviceStrategy

    if name == "single":
        return MaskedSingleDeviceStrategy(masking=method)
    if name == "ddp":
        return MaskedDDPStrategy(process_group_backend="gloo", masking=method)
    return MaskedFSDPStrategy(process_group_backend="gloo", masking=method)


def lightning_worker(args) -> None:
    """One ``Trainer.fit`` of the real strategy; rank 0 writes the row to ``args.out`` (run by :func:`run_strategy`)."""
    import lightning.pytorch as pl
    import torch.distributed as dist

    torch.set_num_threads(1)
    warmup, reps = args.warmup, args.reps
    gen = torch.Generator().manual_seed(1)
    group_ids = torch.tensor((GROUP_IDS * args.batch)[: args.batch])
    ids = torch.randint(0, VOCAB, (args.batch, args.seq), generator=gen)
    # masked, unmasked, masked, ...: the same tokens, with and without group_ids
    batches = [
        {"input_ids": ids, "group_ids": group_ids} if i % 2 == 0 else {"input_ids": ids}
        for i in range(2 * (warmup + reps))
    ]

    class Bench(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build(args.hidden[0], args.layers)
            self.packed_masks = sample_masks(self.model, num_groups=6, coverage=0.05, seed=0)
            self.times: list[tuple[bool, float, float]] = []

        def training_step(self, batch, batch_idx):
            return mean_loss(self.model, batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-6)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(batches, batch_size=None)

        def on_train_start(self):
            engine = self.trainer.strategy.masked._engine
            if engine is not None:
                engine.prefetch = not args.no_prefetch

        def on_train_batch_start(self, batch, batch_idx):
            self._t0 = (time.perf_counter(), time.process_time())

        def on_train_batch_end(self, outputs, batch, batch_idx):
            t, c = time.perf_counter() - self._t0[0], time.process_time() - self._t0[1]
            self.times.append(("group_ids" in batch, t, c))

    module = Bench()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1 if args.strategy == "single" else args.ranks,
        strategy=_strategy(args.strategy, args.method),
        max_steps=len(batches),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(module)
    engine = trainer.strategy.masked._engine
    held = module.packed_masks or {}
    persistent = sum(t.numel() * t.element_size() for t in held.values()) + (engine.cache_bytes if engine else 0)
    transient = engine.peak_gathered_bytes if engine is not None else 0
    local_elements = sum((p._local_tensor if hasattr(p, "_local_tensor") else p).numel() for p in module.parameters())
    per_rank = [(persistent, transient, local_elements)]
    if dist.is_available() and dist.is_initialized():
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, (persistent, transient, local_elements))
    if trainer.global_rank != 0:
        return
    timed_steps = module.times[2 * warmup :]

    def med(masked: bool, i: int) -> float:
        return 1000 * statistics.median(s[i] for s in timed_steps if s[0] is masked)

    row = {
        "strategy": args.strategy,
        "method": ("one_pass" if engine is not None else "lockstep") + ("_gather_on_use" if args.no_prefetch else ""),
        "ranks": trainer.world_size,
        "hidden": args.hidden[0],
        "layers": args.layers,
        "vocab": VOCAB,
        "threads_per_rank": 1,
        "batch_per_rank": args.batch,
        "seq": args.seq,
        "groups_present_per_rank": sorted(set(group_ids.tolist())),
        "reps": reps,
        "step_ms_unmasked": round(med(False, 1), 1),
        "step_ms_masked": round(med(True, 1), 1),
        "ratio": round(med(True, 1) / med(False, 1), 3),
        "cpu_ms_unmasked": round(med(False, 2), 1),
        "cpu_ms_masked": round(med(True, 2), 1),
        "cpu_ratio": round(med(True, 2) / med(False, 2), 3),
        "mask_bytes_persistent_per_rank": [r[0] for r in per_rank],
        "local_param_elements_per_rank": [r[2] for r in per_rank],
        "mask_bytes_transient_peak_per_rank": [r[1] for r in per_rank],
    }
    Path(args.out).write_text(json.dumps(row))


def run_strategy(args) -> None:
    """Launch :func:`lightning_worker` once per method (Lightning starts the other ranks) and print each row."""
    for method in args.methods:
        if method == "microbatch1":
            continue  # the reference loop is not a strategy
        with tempfile.TemporaryDirectory() as tmp, socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            sock.close()
            out = Path(tmp) / "row.json"
            masking = "one_pass" if method == "one_pass_gather_on_use" else method
            cmd = [sys.executable, __file__, "--worker", "--strategy", args.strategy, "--method", masking]
            cmd += ["--no-prefetch"] if method == "one_pass_gather_on_use" else []
            cmd += ["--ranks", str(args.ranks), "--hidden", str(args.hidden[0]), "--layers", str(args.layers)]
            cmd += ["--batch", str(args.batch), "--seq", str(args.seq), "--reps", str(args.reps)]
            cmd += ["--warmup", str(args.warmup), "--out", str(out)]
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            env.pop("LOCAL_RANK", None)
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{args.strategy}/{method} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
            print(out.read_text(), flush=True)


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
    ap.add_argument("--strategy", choices=["single", "ddp", "fsdp"], default=None, help="run the real strategy")
    ap.add_argument("--ranks", type=int, default=2, help="processes for --strategy ddp/fsdp (1 thread each)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--method", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-prefetch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        lightning_worker(args)
        return
    if args.strategy is not None:
        if args.hidden == [512, 128]:
            args.hidden = [512]
        run_strategy(args)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    for hidden in args.hidden:
        run(hidden, args.layers, args.batch, args.seq, args.methods, args.reps, args.warmup)


if __name__ == "__main__":
    main()
