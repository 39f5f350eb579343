"""Step time of every unlearning objective vs a plain NLL fine-tuning step on the same forget batch.

A step is what the Trainer does per batch: the objective's loss (all its forward passes, including the reference),
backward, AdamW step. The plain step is NLL̄ on the forget batch alone (one forward). OracleGrad includes the
restricted-update work of the masked strategies (gradient masking, snapshot, restore); MemFlex its gradient
dropping (half of the tensors selected); AlphaEdit is one edit batch (``v_steps`` δ-optimisation steps + the
closed-form solve per layer), not comparable to a gradient step and reported for scale. Models are randomly
initialised Llamas with a BPE tokenizer; batches hold ``--batch`` forget and ``--batch`` retain rows of
``--seq-len`` tokens, the first half of each row a masked prompt.

    python benchmarks/objective_step.py                       # hidden 128, 4 layers, batch 8x64, full + LoRA
    python benchmarks/objective_step.py --hidden 512 --adapters lora --reps 5

Prints one JSON object per (objective, adapter). ``step_ms`` / ``nll_step_ms`` are median wall-clock times,
``cpu_ms`` / ``nll_cpu_ms`` median process CPU times (robust when other jobs share the cores); ``ratio`` is
``step_ms / nll_step_ms`` and ``cpu_ratio`` the same on CPU times (use it on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import warnings

import torch

from lightning_unlearn.losses import IGNORE_INDEX, nll_loss
from lightning_unlearn.masks import sample_masks, save_masks
from lightning_unlearn.models import AdapterConfig, TinyLlamaConfig, build_tiny_llama, train_bpe_tokenizer
from lightning_unlearn.objectives import (
    NPO,
    AlphaEdit,
    GARetain,
    GradientAscent,
    GradientDifference,
    MemFlex,
    OptimizerConfig,
    OracleGrad,
    SimNPO,
)
from lightning_unlearn.strategies import RestrictedUpdate
from lightning_unlearn.strategies.masked_gradients import resolve_param_masks

OBJECTIVES = ["ga", "gd", "ga_retain", "npo", "simnpo", "memflex", "oracle_grad", "alphaedit"]


def make_model_dir(root: str, hidden: int, layers: int) -> str:
    words = [f"w{i}" for i in range(3000)]
    tok = train_bpe_tokenizer(
        [" ".join(words[i : i + 50]) for i in range(0, 3000, 50)] * 4, vocab_size=2048, save_dir=root
    )
    heads = max(hidden // 64, 2)
    model = build_tiny_llama(tok, TinyLlamaConfig(hidden_size=hidden, num_layers=layers, num_heads=heads))
    model.save_pretrained(root)
    save_masks(os.path.join(root, "masks.safetensors"), sample_masks(model, num_groups=6, coverage=0.05))
    return root


def lm_batch(batch: int, seq_len: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(8, vocab, (batch, seq_len), generator=g)
    labels = ids.clone()
    labels[:, : seq_len // 2] = IGNORE_INDEX
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def build(objective: str, model_dir: str, kind: str):
    adapter = AdapterConfig(kind=kind, dropout=0.0)
    optim = OptimizerConfig(lr=1e-5)
    if objective == "ga":
        return GradientAscent(model_dir, adapter, optim)
    if objective == "gd":
        return GradientDifference(model_dir, adapter, optim)
    if objective == "ga_retain":
        return GARetain(model_dir, adapter, optim)
    if objective == "npo":
        return NPO(model_dir, adapter, optim)
    if objective == "simnpo":
        return SimNPO(model_dir, adapter, optim)
    if objective == "memflex":
        module = MemFlex(model_dir, adapter, optim)
        names = [n for n, p in module.model.named_parameters() if p.requires_grad]
        module.selected = names[::2]
        return module
    if objective == "oracle_grad":
        return OracleGrad(model_dir, os.path.join(model_dir, "masks.safetensors"), adapter, optim)
    return AlphaEdit(model_dir, layers=[0, 1], v_steps=50)


def step_fn(objective: str, module, batch: dict):
    """One training step of ``module`` on ``batch`` (no Trainer: the same work, without loop overhead)."""
    if objective == "alphaedit":
        module.projectors = {
            layer: torch.eye(module._down_proj(layer).in_features, dtype=torch.float64) for layer in module.layers
        }
        module.previous_keys = {}

        def edit():
            from lightning_unlearn.objectives.alphaedit import _last_prompt_positions

            forget = batch["forget"]
            positions = _last_prompt_positions(forget["labels"])
            targets, _ = module.target_values(forget, positions, batch["retain"])
            for i, layer in enumerate(module.layers):
                keys, current = module._keys_and_values(forget, positions, layer)
                module._edit(layer, keys, (targets - current) / (len(module.layers) - i))

        return edit
    optimizer = torch.optim.AdamW(module.trainable_parameters(), lr=1e-5)
    restrict = None
    if objective == "oracle_grad" and module.restrict_update_groups is not None:
        keys = resolve_param_masks(module, module.packed_masks)
        restrict = RestrictedUpdate({p: module.packed_masks[k] for p, k in keys.items()}, module.restrict_update_groups)

    def step():
        loss, _ = module.unlearning_loss(batch)
        loss.backward()
        if restrict is not None:
            restrict.mask_grads()
            restrict.snapshot()
        if objective == "memflex":
            module.on_before_optimizer_step(optimizer)
        optimizer.step()
        if restrict is not None:
            restrict.restore()
        optimizer.zero_grad(set_to_none=True)

    return step


def nll_step_fn(module, batch: dict):
    optimizer = torch.optim.AdamW(module.trainable_parameters(), lr=1e-5)

    def step():
        logps, lengths, _ = module.sequence_logps(batch["forget"])
        nll_loss(logps, lengths).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def timed(fn, reps: int) -> tuple[float, float]:
    wall, cpu = [], []
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - w) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--adapters", nargs="+", default=["full", "lora"])
    parser.add_argument("--objectives", nargs="+", default=OBJECTIVES, choices=OBJECTIVES)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as root:
        model_dir = make_model_dir(root, args.hidden, args.layers)
        batch = {
            "forget": lm_batch(args.batch, args.seq_len, 2048, 0),
            "retain": lm_batch(args.batch, args.seq_len, 2048, 1),
            "mismatch": lm_batch(args.batch, args.seq_len, 2048, 2),
        }
        for kind in args.adapters:
            for objective in args.objectives:
                if objective == "alphaedit" and kind != "full":
                    continue
                module = build(objective, model_dir, kind).train()
                # AlphaEdit freezes its model: time the NLL step on an equal, trainable full model.
                reference = build("ga", model_dir, "full") if objective == "alphaedit" else module
                plain, step = nll_step_fn(reference, batch), step_fn(objective, module, batch)
                for _ in range(args.warmup):
                    plain()
                    step()
                # Alternate so that both see the same background load.
                rows = [(timed(plain, 1), timed(step, 1)) for _ in range(args.reps)]
                nll_ms = statistics.median(r[0][0] for r in rows)
                step_ms = statistics.median(r[1][0] for r in rows)
                cpu_ms = statistics.median(r[1][1] for r in rows)
                nll_cpu_ms = statistics.median(r[0][1] for r in rows)
                print(
                    json.dumps(
                        {
                            "objective": objective,
                            "adapter": kind,
                            "hidden": args.hidden,
                            "layers": args.layers,
                            "batch": args.batch,
                            "seq_len": args.seq_len,
                            "step_ms": round(step_ms, 1),
                            "nll_step_ms": round(nll_ms, 1),
                            "ratio": round(step_ms / nll_ms, 2),
                            "cpu_ms": round(cpu_ms, 1),
                            "nll_cpu_ms": round(nll_cpu_ms, 1),
                            "cpu_ratio": round(cpu_ms / nll_cpu_ms, 2),
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
