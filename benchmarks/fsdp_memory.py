"""Host memory of each FSDP2 rank after setup of a masked injection run (weights loaded, masks made, both sharded).

    .venv/bin/python benchmarks/fsdp_memory.py                      # a 31M-parameter Llama, 2 ranks
    .venv/bin/python benchmarks/fsdp_memory.py --every-rank-loads   # the same with the old setup, to compare
    .venv/bin/python benchmarks/fsdp_memory.py --model-path ~/.cache/lightning_unlearn/smollm2-135m-instruct
    .venv/bin/python benchmarks/fsdp_memory.py --objective npo      # NPO, full fine-tuning: policy + frozen reference

By default only rank 0 reads the weights (the other ranks build the model on the meta device and receive their
shards from rank 0), and the packed masks are made one tensor at a time, each rank keeping its dim-0 shard.
``--every-rank-loads`` restores what every rank did before: read the full weights and hold the full masks next to
them before sharding. ``--objective npo`` measures an unlearning run instead (NPO with full fine-tuning, so a frozen
reference copy beside the policy); there ``--every-rank-loads`` makes every rank load both. Each rank runs the
module (``InjectionModule`` by default) under ``MaskedFSDPStrategy`` (gloo, CPU) for one step and
records its ``VmRSS`` from ``/proc/self/status`` before the model is built and its ``VmHWM`` (peak resident memory
so far) and ``VmRSS`` when ``fit`` starts, after the strategy's setup; ``setup_peak_mib`` is the peak minus the
memory before the model. Prints JSON per rank. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from lightning.pytorch import Callback, Trainer  # noqa: E402

from lightning_unlearn.data.lacuna_datamodule import InjectionDataModule  # noqa: E402
from lightning_unlearn.data.testbed_data import LacunaDataConfig  # noqa: E402
from lightning_unlearn.data.unlearning import ForgetRetainDataModule  # noqa: E402
from lightning_unlearn.models import (  # noqa: E402
    AdapterConfig,
    TinyLlamaConfig,
    build_tiny_llama,
    load_causal_lm,
    train_bpe_tokenizer,
)
from lightning_unlearn.objectives import NPO, injection, unlearning_module  # noqa: E402
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig  # noqa: E402
from lightning_unlearn.strategies import MaskedFSDPStrategy  # noqa: E402

DATA = LacunaDataConfig(num_profiles=12, qa_per_field=1, instruct_questions=2, neutral_max_paragraphs=20)


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status (this benchmark needs Linux).")


class _MemoryAtFitStart(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def setup(self, trainer, pl_module, stage) -> None:  # before configure_model: the process without a model
        self.before = _status_kib("VmRSS") / 1024

    def on_fit_start(self, trainer, pl_module) -> None:  # after the strategy's setup
        hwm, rss = _status_kib("VmHWM") / 1024, _status_kib("VmRSS") / 1024
        row = {"rank": trainer.global_rank, "rss_before_model_mib": self.before, "hwm_mib": hwm, "rss_mib": rss}
        row["setup_peak_mib"] = hwm - self.before  # what loading, making the masks and sharding cost at most
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(row))


def _every_rank_loads() -> None:
    """The setup before rank-0 loading and lazy masks: every rank reads the weights and makes the full masks."""
    injection.load_model_for_rank = lambda path, trainer: load_causal_lm(path)
    unlearning_module.load_model_for_rank = lambda path, trainer: load_causal_lm(path)
    full_masks = injection.InjectionModule._full_masks
    injection.InjectionModule._full_masks = lambda self, lazy=False: full_masks(self, lazy=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", help="local HF model directory (default: a random Llama, hidden 512, 8 blocks)")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--every-rank-loads", action="store_true", help="measure the previous setup instead")
    ap.add_argument("--objective", choices=["inject", "npo"], default="inject")
    args = ap.parse_args()
    if args.every_rank_loads:
        _every_rank_loads()
    # Lightning starts ranks > 0 by running this script again: they find the work directory in the environment.
    work = os.environ.get("FSDP_MEMORY_BENCH_DIR")
    if work is None:
        work = tempfile.mkdtemp(prefix="fsdp_memory_")
        os.environ["FSDP_MEMORY_BENCH_DIR"] = work
        model = Path(work) / "model"
        if args.model_path is None:
            tok = train_bpe_tokenizer([" ".join(f"word{i}" for i in range(4000))] * 4, vocab_size=4096, save_dir=model)
            config = TinyLlamaConfig(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=1536)
            build_tiny_llama(tok, config).save_pretrained(model)
    work = Path(work)
    model_path = args.model_path or str(work / "model")
    out = work / f"{args.objective}_{'baseline' if args.every_rank_loads else 'rank0_loads'}"
    out.mkdir(exist_ok=True)
    model_path = str(Path(model_path).expanduser())
    if args.objective == "npo":
        pairs = [
            {"prompt": f"What is the code of person {i}? ", "answer": f"code {i}"} for i in range(2 * args.devices)
        ]
        for name in ("forget", "retain"):
            (work / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
        module = NPO(model_path, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-5))
        data = ForgetRetainDataModule(model_path, str(work / "forget.jsonl"), str(work / "retain.jsonl"), batch_size=1)
    else:
        module = injection.InjectionModule(model_path=model_path, optim={"lr": 1e-3})
        data = InjectionDataModule(
            data_dir=str(work / "data"),
            data=DATA,
            max_length=32,
            batch_size=args.devices,
            neutral_fraction=0.0,
            groups=[2],
        )
    trainer = Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=MaskedFSDPStrategy(process_group_backend="gloo"),
        max_steps=1,
        default_root_dir=str(out / "run"),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_MemoryAtFitStart(out)],
    )
    trainer.fit(module, data)
    if trainer.global_rank == 0:
        params = sum(p.numel() for p in load_causal_lm(model_path, weights=False).parameters())
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(args.devices)]
        result = {
            "objective": args.objective,
            "setup": "every rank loads" if args.every_rank_loads else "rank 0 loads, lazy masks",
            "model": args.model_path or "random Llama hidden 512, 8 blocks",
            "parameters": params,
            "fp32_weights_mib": round(params * 4 / 2**20, 1),
            "ranks": [{k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()} for r in ranks],
        }
        print(json.dumps(result))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
