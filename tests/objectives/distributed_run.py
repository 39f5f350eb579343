"""Run unlearning objectives with a real Lightning Trainer on 2 CPU processes (gloo); one rank per launch.

Launched by ``test_distributed.py`` twice with ``LOCAL_RANK=0/1`` (Lightning then creates no processes itself), so
several ``Trainer.fit`` calls share one process group. Usage::

    python distributed_run.py SPEC.json

SPEC: ``{"model_dir", "forget", "retain", "masks", "out", "cases": [{"name", "objective", "adapter", "strategy",
"lr", "max_steps", "max_bad_loss", "checkpoint_every", "validate", "reference", "masked" (MaskedFSDPStrategy /
MaskedDDPStrategy for any objective), "resume_from" ({"case", "step"}), "save_trainable" (rank 0 writes the trained
tensors to ``out/<name>/trainable.pt``), "init_args" (more objective arguments), "seed" (torch seed set just before
``fit``, so a LoRA adapter initialises as in a one-process run)}]}``; ``"forget_preferred"``: the forget set with a
``preferred`` column, for DPO (``PreferenceDataModule``). Rank 0 writes ``out/results.json``.
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import sys
import time
import warnings

import torch

torch.set_num_threads(1)
warnings.filterwarnings("ignore")

from lightning.pytorch import Trainer  # noqa: E402
from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy  # noqa: E402

from lightning_unlearn.data.collate import encode_prompt_answer, pad_batch  # noqa: E402
from lightning_unlearn.data.preference import PreferenceDataModule  # noqa: E402
from lightning_unlearn.data.records import read_records  # noqa: E402
from lightning_unlearn.data.unlearning import ForgetRetainDataModule  # noqa: E402
from lightning_unlearn.losses import nll_loss, sequence_logprobs  # noqa: E402
from lightning_unlearn.masks import load_masks, union_mask  # noqa: E402
from lightning_unlearn.models import AdapterConfig, load_causal_lm  # noqa: E402
from lightning_unlearn.objectives import (  # noqa: E402
    DPO,
    NPO,
    RMU,
    UNDIAL,
    WGA,
    GradientAscent,
    IdkDPO,
    IdkNLL,
    MemFlex,
    OracleGrad,
    SatImp,
    SimNPO,
)
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig  # noqa: E402
from lightning_unlearn.strategies import MaskedDDPStrategy, MaskedFSDPStrategy  # noqa: E402

OBJECTIVES = {"npo": NPO, "simnpo": SimNPO, "oracle_grad": OracleGrad, "ga": GradientAscent, "memflex": MemFlex,
              "idk_nll": IdkNLL, "dpo": DPO, "idk_dpo": IdkDPO, "undial": UNDIAL, "wga": WGA,
              "satimp": SatImp, "rmu": RMU}  # fmt: skip


def make_strategy(kind: str, masked: bool):
    if kind == "ddp":
        return MaskedDDPStrategy(process_group_backend="gloo") if masked else DDPStrategy(process_group_backend="gloo")
    if masked:
        return MaskedFSDPStrategy(data_parallel_size=2, process_group_backend="gloo")
    return ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, process_group_backend="gloo")


@torch.no_grad()
def mean_nll(model, tokenizer, rows) -> float:
    batch = pad_batch(
        [encode_prompt_answer(tokenizer, r["prompt"], r["answer"], 64) for r in rows], tokenizer.pad_token_id
    )
    model.eval()
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return float(nll_loss(*sequence_logprobs(logits, batch["labels"])))


class RecordBatches(Callback):
    """Remembers the token ids of every forget and retain row this rank trains on."""

    def __init__(self) -> None:
        self.rows = {"forget": [], "retain": []}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        for key in self.rows:
            self.rows[key].append(
                sorted(
                    tuple(r[m.bool()].tolist()) for r, m in zip(batch[key]["input_ids"], batch[key]["attention_mask"])
                )
            )


def same_rows_across_ranks(rows: list) -> int:
    """Steps at which both ranks trained on exactly the same rows."""
    gathered = [None, None]
    torch.distributed.all_gather_object(gathered, rows)
    return sum(a == b for a, b in zip(*gathered))


def full_state(module) -> dict[str, torch.Tensor]:
    if module._sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(module.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in module.model.state_dict().items()}


def run_case(spec: dict, case: dict) -> dict:
    cls = OBJECTIVES[case["objective"]]
    adapter = AdapterConfig(kind=case["adapter"], dropout=0.0)
    optim = OptimizerConfig(lr=case["lr"])
    extra = {"masks_path": spec["masks"]} if cls is OracleGrad else {}
    if cls is MemFlex:
        extra = {"gradient_threshold": 1e-4}  # tiny-model gradient scale
    if case.get("reference"):
        extra["reference"] = case["reference"]
    extra.update(case.get("init_args", {}))
    module = cls(spec["model_dir"], adapter=adapter, optim=optim, max_bad_loss=case.get("max_bad_loss"), **extra)
    if cls is DPO:
        dm = PreferenceDataModule(spec["model_dir"], spec["forget_preferred"], spec["retain"], batch_size=2)
    else:
        dm = ForgetRetainDataModule(spec["model_dir"], spec["forget"], spec["retain"], batch_size=2)
    recorder = RecordBatches()
    callbacks = [recorder]
    ckpt_dir = os.path.join(spec["out"], case["name"])
    if case.get("checkpoint_every"):
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=case["checkpoint_every"], save_top_k=-1))
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=make_strategy(case["strategy"], cls is OracleGrad or case.get("masked")),
        max_steps=case.get("max_steps", 20),
        limit_val_batches=1.0 if case.get("validate") else 0,
        check_val_every_n_epoch=10,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=case.get("checkpoint_every") is not None,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=ckpt_dir,
    )
    resume = case.get("resume_from")  # {"case": name, "step": N}: continue from that case's step-N checkpoint
    ckpt_path = (
        os.path.join(spec["out"], resume["case"], f"epoch={resume['step'] - 1}-step={resume['step']}.ckpt")
        if resume
        else None
    )
    if "seed" in case:
        torch.manual_seed(case["seed"])
    trainer.fit(module, dm, ckpt_path=ckpt_path)
    if case.get("save_trainable"):
        state = full_state(module)
        if trainer.global_rank == 0:
            os.makedirs(ckpt_dir, exist_ok=True)
            trainable = {n for n, p in module.model.named_parameters() if p.requires_grad}
            torch.save({k: v for k, v in state.items() if k in trainable}, os.path.join(ckpt_dir, "trainable.pt"))
    forget, retain = read_records(spec["forget"]), read_records(spec["retain"])
    result = {
        "global_step": trainer.global_step,
        "stop_reason": module.stop_reason,
        "stopped_at_step": module.stopped_at_step,
        "forget_nll": mean_nll(module.model, module.tokenizer, forget),
        "retain_nll": mean_nll(module.model, module.tokenizer, retain),
        "world_size": trainer.world_size,
        "sharded": module._sharded,
        "val_forget_nll": float(trainer.callback_metrics.get("val/forget_nll", float("nan"))),
        "val_retain_nll": float(trainer.callback_metrics.get("val/retain_nll", float("nan"))),
        "steps_with_same_forget_rows": same_rows_across_ranks(recorder.rows["forget"]),
        "steps_with_same_retain_rows": same_rows_across_ranks(recorder.rows["retain"]),
    }
    if module.reference_model is not None:
        # Every rank runs the (sharded) reference forward; rank 0 compares it with the start model from disk.
        forget_rows = read_records(spec["forget"])
        batch = pad_batch(
            [encode_prompt_answer(module.tokenizer, r["prompt"], r["answer"], 64) for r in forget_rows],
            module.tokenizer.pad_token_id,
        )
        got = module.reference_logits(batch)
        if trainer.global_rank == 0:
            with torch.no_grad():
                want = load_causal_lm(spec["model_dir"])(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                ).logits
            result["reference_gap"] = float((got - want).abs().max())
    if cls is MemFlex:
        gathered = [None, None]
        torch.distributed.all_gather_object(gathered, module.selected)
        result["memflex_selected"] = len(module.selected)
        result["memflex_same_selection_on_ranks"] = gathered[0] == gathered[1]
    if cls is OracleGrad and case["adapter"] == "full":
        state = full_state(module)
        if trainer.global_rank == 0:
            packed, _ = load_masks(spec["masks"])
            forget_mask = union_mask(packed, [0, 1, 2])
            start = load_causal_lm(spec["model_dir"]).state_dict()
            result["outside_unchanged"] = all(
                torch.equal(state[k][~forget_mask[k]], v[~forget_mask[k]]) for k, v in start.items()
            )
            result["inside_changed"] = sum(int((state[k] != v).sum()) for k, v in start.items())
    return result


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec = json.load(open(sys.argv[1]))
    results = {}
    for case in spec["cases"]:
        start = time.perf_counter()
        results[case["name"]] = run_case(spec, case)
        results[case["name"]]["seconds"] = round(time.perf_counter() - start, 2)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        with open(os.path.join(spec["out"], "results.json"), "w") as fh:
            json.dump(results, fh, indent=1)
    # Tear the process group down explicitly: gloo threads alive at interpreter exit abort the process.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    # Nothing is collected after the run: the last garbage collection at exit skips the import graph (1-2 s of CPU).
    atexit.register(gc.freeze)
    main()
