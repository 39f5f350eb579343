"""Run a masked training with a real Lightning Trainer; launched by the multi-process tests as a script.

Usage: python _worker.py STRATEGY MODEL_DIR DATA_FILE OUT_DIR [--devices N] [--num-nodes N] [--restrict]
    [--masking auto|one_pass|lockstep] [--precision 32-true|bf16-mixed] [--keep-unsharded] [--no-masks]
    [--accumulate N]
or: python _worker.py --runs RUNS.json, a JSON list of such argument lists, trained one after the other in the same
    processes (one launch, one process group; every run of a list must have the same devices and num-nodes).
Rank 0 writes ``OUT_DIR/params.pt`` (full parameters after training); every rank writes ``OUT_DIR/rank{r}.json``
(packed-mask bytes it holds, its local parameter elements, whether the step ran in one pass, and the largest full
mask it gathered).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _masked_lm import MaskedLM  # noqa: E402
from lightning.pytorch import Callback, Trainer  # noqa: E402

from lightning_unlearn.strategies import MaskedDDPStrategy, MaskedFSDPStrategy  # noqa: E402


class _Dump(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_end(self, trainer, pl_module) -> None:
        full = {}
        for name, p in pl_module.model.named_parameters():
            full[name] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        masks = pl_module.packed_masks or {}
        local = sum((p._local_tensor if hasattr(p, "_local_tensor") else p).numel() for p in pl_module.parameters())
        engine = trainer.strategy.masked._engine
        info = {
            "mask_bytes": sum(t.numel() * t.element_size() for t in masks.values()),
            "local_elements": local,
            "one_pass": engine is not None,
            "peak_gathered_bytes": engine.peak_gathered_bytes if engine is not None else 0,
            "prefetched_gathers": list(engine.prefetched_gathers) if engine is not None else [0, 0],
        }
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(info))
        if trainer.global_rank == 0:
            torch.save(full, self.out / "params.pt")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("strategy", choices=["ddp", "fsdp"])
    ap.add_argument("model_dir")
    ap.add_argument("data_file")
    ap.add_argument("out_dir")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--num-nodes", type=int, default=1)
    ap.add_argument("--restrict", action="store_true")
    ap.add_argument("--masking", default="auto")
    ap.add_argument("--precision", default="32-true")
    ap.add_argument("--keep-unsharded", action="store_true", help="FSDP: reshard_after_forward=False")
    ap.add_argument("--no-masks", action="store_true", help="plain training (masks off)")
    ap.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches (steps: batches // N)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    data = torch.load(args.data_file)
    out = Path(args.out_dir)
    module = MaskedLM(
        args.model_dir,
        data["batches"],
        None
        if args.no_masks
        else data.pop("masks"),  # the strategy replaces them with this rank's shard; keep no other reference
        optimizer="adamw" if args.restrict else "sgd",
        lr=0.01 if args.restrict else 0.5,
        restrict_update_groups=[0, 1, 2] if args.restrict else None,
    )
    if args.strategy == "ddp":
        strategy = MaskedDDPStrategy(process_group_backend="gloo", masking=args.masking)
    else:
        strategy = MaskedFSDPStrategy(
            process_group_backend="gloo", masking=args.masking, reshard_after_forward=not args.keep_unsharded
        )
    trainer = Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=strategy,
        max_steps=len(data["batches"]) // args.accumulate,
        accumulate_grad_batches=args.accumulate,
        precision=args.precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[_Dump(out)],
    )
    trainer.fit(module)


if __name__ == "__main__":
    # Nothing is collected after the run: the last garbage collection at exit skips the import graph (1-2 s of CPU).
    atexit.register(gc.freeze)
    if sys.argv[1:2] == ["--runs"]:
        for run in json.loads(Path(sys.argv[2]).read_text()):
            main(run)
    else:
        main()
