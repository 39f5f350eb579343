"""NPO, SimNPO and OracleGrad with a real Lightning Trainer on 2 CPU processes (gloo): DDP and FSDP2, LoRA and full
fine-tuning, in ONE launch of two ranks (see ``distributed_run.py``); in the same launch, the issue-32 objectives
(IdkNLL, DPO, IdkDPO, UNDIAL, WGA, SatImp, RMU) under FSDP2, and RMU under DDP, against one process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FORGET, RETAIN, mean_nll, write_jsonl
from peft import PeftModel

from lightning_unlearn.models import AdapterConfig, load_causal_lm

RUNNER = Path(__file__).with_name("distributed_run.py")
LR = {"lora": 1e-2, "full": 1e-3}
# Issue-32 objectives, each 3 steps under FSDP2 (2 ranks × batch 2) and in one process (batch 4): the same batches.
# Full fine-tuning (the reference a sharded frozen copy) for all; LoRA (the reference = adapter disabled) for two.
EXACT_CASES = [
    *[(obj, "full") for obj in ("idk_nll", "dpo", "idk_dpo", "undial", "wga", "satimp")],
    ("idk_dpo", "lora"),
    ("undial", "lora"),
    ("rmu", "full"),  # only blocks 0-2's mlp.down_proj train (requires_grad inside sharded blocks)
    ("rmu", "lora"),
]
# RMU also under DDP (its control vector is a buffer, which DDP broadcasts from rank 0 at every forward).
EXACT_STRATEGY_CASES = [(obj, adapter, "fsdp") for obj, adapter in EXACT_CASES] + [("rmu", "full", "ddp")]
EXACT_INIT_ARGS = {"rmu": {"layer": 2}}  # the testbed's 4 blocks
EXACT_STEPS = 3
# AdamW turns fp32 rounding differences of near-zero gradients (LoRA A while B ≈ 0; SatImp's p^5(1 − p) weights on
# memorised tokens) into update differences up to ~lr per step (measured at lr 1e-3: 2.7e-5 for SatImp full, 6.7e-5
# for UNDIAL LoRA at 1e-2). A wrong loss reduction over ranks moves weights by ~lr too, so lr 1e-4 keeps that
# detectable above the 1e-5 tolerance while the rounding noise stays below it.
EXACT_LR = 1e-4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(spec_path: Path, out: Path, timeout: float = 300) -> dict:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE="2",
            NODE_RANK="0",
            LOCAL_RANK=str(rank),
            OMP_NUM_THREADS="1",
            CUDA_VISIBLE_DEVICES="",
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
        )
        log = open(out / f"rank{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, str(RUNNER), str(spec_path)], env=env, stdout=log, stderr=log))
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if codes != [0, 0]:
        raise AssertionError(f"ranks exited with {codes}:\n" + (out / "rank0.log").read_text()[-4000:])
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def distributed_results(testbed, tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    cases = [
        {
            "name": f"{obj}_{adapter}_{strategy}",
            "objective": obj,
            "adapter": adapter,
            "strategy": strategy,
            "lr": LR[adapter],
        }
        for strategy in ("ddp", "fsdp")
        for obj in ("npo", "simnpo", "oracle_grad")
        for adapter in ("lora", "full")
    ]
    for case in cases:
        if case["name"] in ("npo_lora_fsdp", "npo_full_fsdp", "oracle_grad_lora_ddp"):
            case["checkpoint_every"] = 10
        if case["name"] in ("npo_full_ddp", "simnpo_lora_fsdp"):
            case["validate"] = True  # forget/retain NLL validation every 10 epochs (= steps here)
    # NPO with precomputed reference log-probs (no frozen copy): computed collectively before the first step.
    cases += [
        {
            "name": "npo_precomputed_full_fsdp",
            "objective": "npo",
            "adapter": "full",
            "strategy": "fsdp",
            "lr": 1e-3,
            "reference": "precomputed",
        }
    ]
    # MemFlex's localisation is collective under FSDP and local under DDP: both must select the same tensors.
    cases += [
        {
            "name": f"memflex_full_{strategy}",
            "objective": "memflex",
            "adapter": "full",
            "strategy": strategy,
            "lr": 1e-3,
        }
        for strategy in ("ddp", "fsdp")
    ]
    # Full fine-tuning with a frozen reference under MaskedFSDPStrategy: rank 1 builds both on the meta device.
    cases += [
        {
            "name": "npo_full_fsdp_masked",
            "objective": "npo",
            "adapter": "full",
            "strategy": "fsdp",
            "lr": LR["full"],
            "masked": True,
        }
    ]
    # LoRA under MaskedFSDPStrategy: sharded checkpoints without the frozen base, and an exact resume from one.
    cases += [
        {
            "name": "npo_lora_fsdp_partial",
            "objective": "npo",
            "adapter": "lora",
            "strategy": "fsdp",
            "lr": LR["lora"],
            "masked": True,
            "checkpoint_every": 10,
            "save_trainable": True,
        },
        {
            "name": "npo_lora_fsdp_partial_resumed",
            "objective": "npo",
            "adapter": "lora",
            "strategy": "fsdp",
            "lr": LR["lora"],
            "masked": True,
            "checkpoint_every": 10,
            "save_trainable": True,
            "resume_from": {"case": "npo_lora_fsdp_partial", "step": 10},
        },
    ]
    # Stop rule across ranks: the forget NLL passes max_bad_loss within a few GA steps.
    cases.append(
        {
            "name": "ga_stop_ddp",
            "objective": "ga",
            "adapter": "full",
            "strategy": "ddp",
            "lr": 3e-3,
            "max_bad_loss": 2.0,
            "checkpoint_every": 1,
        }
    )
    # Exactness against one process (test_issue32_objectives_under_fsdp_equal_one_process); not trained to forget.
    cases += [
        {
            "name": f"exact_{obj}_{adapter}_{strategy}",
            "objective": obj,
            "adapter": adapter,
            "strategy": strategy,
            "lr": EXACT_LR,
            "max_steps": EXACT_STEPS,
            "save_trainable": True,
            "seed": 0,
            "init_args": EXACT_INIT_ARGS.get(obj, {}),
        }
        for obj, adapter, strategy in EXACT_STRATEGY_CASES
    ]
    preferred = out / "forget_preferred.jsonl"
    write_jsonl(preferred, [{**r, "preferred": f"I do not know about {r['prompt'].split()[-2]}"} for r in FORGET])
    spec = {
        "forget_preferred": str(preferred),
        "model_dir": testbed.model_dir,
        "forget": testbed.forget,
        "retain": testbed.retain,
        "masks": testbed.masks,
        "out": str(out),
        "cases": cases,
    }
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec))
    return out, launch(spec_path, out)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_forget_nll_rises_more_than_retain_under_ddp_and_fsdp(testbed, distributed_results):
    _, results = distributed_results
    start = load_causal_lm(testbed.model_dir)
    f0, r0 = mean_nll(start, testbed.tokenizer, FORGET), mean_nll(start, testbed.tokenizer, RETAIN)
    for name, res in results.items():
        if name.startswith(("ga_stop", "exact_")):
            continue
        assert res["world_size"] == 2 and res["global_step"] == 20, (name, res)
        assert res["sharded"] == ("_fsdp" in name), name
        assert res["forget_nll"] - f0 > res["retain_nll"] - r0, (name, res, f0, r0)
        assert res["forget_nll"] - f0 > 0.5, (name, res, f0)
        # Each rank trains on its own shard of forget AND retain pairs at every step.
        assert res["steps_with_same_forget_rows"] == 0 and res["steps_with_same_retain_rows"] == 0, (name, res)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_oracle_grad_full_leaves_weights_outside_forget_mask_unchanged(distributed_results):
    _, results = distributed_results
    for strategy in ("ddp", "fsdp"):
        res = results[f"oracle_grad_full_{strategy}"]
        assert res["outside_unchanged"] is True, strategy
        assert res["inside_changed"] > 0, strategy


@pytest.mark.multiprocess
@pytest.mark.slow
def test_lora_checkpoints_write_reloadable_adapters(testbed, distributed_results):
    out, _ = distributed_results
    for step in (10, 20):
        adapter = out / "npo_lora_fsdp" / f"adapter-step={step}"
        model = PeftModel.from_pretrained(load_causal_lm(testbed.model_dir), str(adapter))
        assert any("lora_B" in n and p.abs().sum() > 0 for n, p in model.named_parameters())
        assert (out / "npo_lora_fsdp" / f"epoch={step - 1}-step={step}.ckpt").exists()
        # FSDP full fine-tuning: a sharded checkpoint directory without the frozen reference copy.
        sharded = out / "npo_full_fsdp" / f"epoch={step - 1}-step={step}.ckpt"
        assert (sharded / "meta.pt").exists() and not list(sharded.parent.glob("adapter-step=*"))
        merged = load_causal_lm(out / "oracle_grad_lora_ddp" / f"merged-step={step}")
        assert mean_nll(merged, testbed.tokenizer, FORGET) > mean_nll(
            load_causal_lm(testbed.model_dir), testbed.tokenizer, FORGET
        )


@pytest.mark.multiprocess
@pytest.mark.slow
def test_only_rank_0_reads_the_weights_under_masked_fsdp(distributed_results):
    # UnlearningModule builds its model in configure_model: under MaskedFSDPStrategy rank 1 gets meta skeletons
    # (policy and reference), which the strategy fills from rank 0 after sharding. A wrong fill would show in the
    # reference, which must still be the start model after training.
    out, results = distributed_results
    rank1 = (out / "rank1.log").read_text()
    masked_cases = [
        n for n in results if n.startswith(("oracle_grad_", "npo_full_fsdp_masked", "npo_lora_fsdp_")) and "_fsdp" in n
    ]
    assert rank1.count("rank 1: model built on the meta device") == len(masked_cases), masked_cases
    assert (out / "rank0.log").read_text().count("model built on the meta device") == 0
    assert results["npo_full_fsdp_masked"]["reference_gap"] <= 1e-5
    assert results["npo_full_fsdp"]["reference_gap"] <= 1e-5  # Lightning's ModelParallelStrategy: every rank loads


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sharded_lora_checkpoints_omit_the_base_and_resume_exactly(distributed_results):
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    out, results = distributed_results
    partial = out / "npo_lora_fsdp_partial" / "epoch=9-step=10.ckpt"
    full = out / "npo_lora_fsdp" / "epoch=9-step=10.ckpt"  # Lightning's ModelParallelStrategy keeps every key
    keys = [k for k in FileSystemReader(partial).read_metadata().state_dict_metadata if k.startswith("state_dict.")]
    full_keys = [k for k in FileSystemReader(full).read_metadata().state_dict_metadata if k.startswith("state_dict.")]
    # the same adapter tensors, and none of the frozen base (which is model_path again)
    assert keys and set(keys) == {k for k in full_keys if "lora_" in k}, keys[:5]
    assert any("base_layer" in k for k in full_keys) and any("embed_tokens" in k for k in full_keys)
    assert results["npo_lora_fsdp_partial_resumed"]["global_step"] == 20
    straight = torch.load(out / "npo_lora_fsdp_partial" / "trainable.pt", weights_only=True)
    resumed = torch.load(out / "npo_lora_fsdp_partial_resumed" / "trainable.pt", weights_only=True)
    assert straight.keys() == resumed.keys() and any("lora_B" in k for k in straight)
    for k, v in straight.items():
        assert torch.allclose(v, resumed[k], atol=1e-6), k
    assert any(v.abs().sum() > 0 for k, v in straight.items() if "lora_B" in k)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_stop_rule_stops_every_rank_and_keeps_good_checkpoints(distributed_results):
    out, results = distributed_results
    res = results["ga_stop_ddp"]
    assert res["stop_reason"] is not None and "max_bad_loss" in res["stop_reason"]
    bad = res["stopped_at_step"]
    assert 2 <= bad < 20
    log = (out / "rank0.log").read_text() + (out / "rank1.log").read_text()
    assert log.count("stopping GradientAscent") == 1
    # every checkpoint before the bad step is kept, the bad step's (saved before its loss was seen) is not
    kept = sorted(int(p.stem.split("step=")[1]) for p in (out / "ga_stop_ddp").glob("*.ckpt"))
    assert kept == list(range(1, bad))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_validation_reports_forget_and_retain_nll_over_all_ranks(distributed_results):
    _, results = distributed_results
    for name in ("npo_full_ddp", "simnpo_lora_fsdp"):
        res = results[name]
        # The last validation ran after the last step: its rank-averaged NLLs equal the whole-set NLLs.
        assert res["val_forget_nll"] == pytest.approx(res["forget_nll"], abs=1e-3), name
        assert res["val_retain_nll"] == pytest.approx(res["retain_nll"], abs=1e-3), name


@pytest.mark.multiprocess
@pytest.mark.slow
def test_memflex_localises_identically_on_every_rank(distributed_results):
    _, results = distributed_results
    ddp, fsdp = results["memflex_full_ddp"], results["memflex_full_fsdp"]
    assert ddp["memflex_same_selection_on_ranks"] and fsdp["memflex_same_selection_on_ranks"]
    assert ddp["memflex_selected"] == fsdp["memflex_selected"] > 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_npo_precomputed_reference_matches_the_reference_copy_under_fsdp(distributed_results):
    _, results = distributed_results
    copy, precomputed = results["npo_full_fsdp"], results["npo_precomputed_full_fsdp"]
    assert precomputed["forget_nll"] == pytest.approx(copy["forget_nll"], rel=1e-4)
    assert precomputed["retain_nll"] == pytest.approx(copy["retain_nll"], rel=1e-4)


def _one_process_trainable(testbed, spec_out: Path, objective: str, adapter: str) -> dict:
    """The trainable tensors after EXACT_STEPS steps of ``objective`` in this process with batch 4."""
    import torch
    from lightning.pytorch import Trainer

    from lightning_unlearn import objectives
    from lightning_unlearn.data.preference import PreferenceDataModule
    from lightning_unlearn.data.unlearning import ForgetRetainDataModule

    names = {
        "idk_nll": "IdkNLL",
        "dpo": "DPO",
        "idk_dpo": "IdkDPO",
        "undial": "UNDIAL",
        "wga": "WGA",
        "satimp": "SatImp",
        "rmu": "RMU",
    }
    cls = getattr(objectives, names[objective])
    optim = objectives.OptimizerConfig(lr=EXACT_LR)
    adapter_config = AdapterConfig(kind=adapter, dropout=0.0)
    module = cls(testbed.model_dir, adapter=adapter_config, optim=optim, **EXACT_INIT_ARGS.get(objective, {}))
    forget = str(spec_out / "forget_preferred.jsonl") if objective == "dpo" else testbed.forget
    datamodule = PreferenceDataModule if objective == "dpo" else ForgetRetainDataModule
    dm = datamodule(testbed.model_dir, forget, testbed.retain, batch_size=4)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=EXACT_STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=str(spec_out / f"single_{objective}_{adapter}"),
    )
    torch.manual_seed(0)
    trainer.fit(module, dm)
    return {n: p.detach() for n, p in module.model.named_parameters() if p.requires_grad}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("objective,adapter,strategy", EXACT_STRATEGY_CASES)
def test_issue32_objectives_under_fsdp_equal_one_process(testbed, distributed_results, objective, adapter, strategy):
    import torch

    out, results = distributed_results
    name = f"exact_{objective}_{adapter}_{strategy}"
    assert results[name]["global_step"] == EXACT_STEPS, results[name]
    assert results[name]["sharded"] == (strategy == "fsdp"), results[name]
    sharded = torch.load(out / name / "trainable.pt", weights_only=True)
    single = _one_process_trainable(testbed, out, objective, adapter)
    start = load_causal_lm(testbed.model_dir).state_dict()
    assert sharded.keys() == single.keys()
    gap = max((sharded[k] - single[k]).abs().max().item() for k in single)
    # how far training moved the weights: full fine-tuning from the start model, LoRA's B from its zero init
    moved = max(
        (single[k] - (start[k] if k in start else torch.zeros_like(single[k]))).abs().max().item()
        for k in single
        if k in start or "lora_B" in k
    )
    assert gap <= 1e-5 < moved, (gap, moved)
