"""Exactness of the Lightning masked strategies against the paper's microbatch-1 loop (Algorithm 1)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _masked_lm import MaskedLM, make_batches, reference_training, relative_gap
from lightning.pytorch import Trainer

from lightning_unlearn.masks import group_mask, sample_masks
from lightning_unlearn.models import load_causal_lm
from lightning_unlearn.strategies import MaskedSingleDeviceStrategy

WORKER = Path(__file__).with_name("_worker.py")


@pytest.fixture(scope="module")
def problem(tiny_dir):
    """Masks, 3 batches with all 7 group ids, the masked reference after 3 SGD steps, and plain training."""
    model = load_causal_lm(tiny_dir)
    masks = sample_masks(model, num_groups=6, coverage=0.05, seed=0)
    batches = make_batches(model.config.vocab_size, steps=3)
    reference = reference_training(model, batches, masks)
    plain = reference_training(load_causal_lm(tiny_dir), batches, None)
    gap = relative_gap({f"model.{k}": v for k, v in plain.items()}, {f"model.{k}": v for k, v in reference.items()})
    assert gap > 1e-3, "the test could not tell masked from unmasked training"
    return {"masks": masks, "batches": batches, "reference": reference, "plain": plain, "plain_gap": gap}


def _trainer(strategy, steps: int = 3, accumulate: int = 1) -> Trainer:
    return Trainer(
        accelerator="cpu",
        accumulate_grad_batches=accumulate,
        devices=1,
        strategy=strategy,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )


def _params(module) -> dict[str, torch.Tensor]:
    return {n.removeprefix("model."): p.detach().clone() for n, p in module.named_parameters()}


def _gap(got, problem) -> float:
    return relative_gap(got, problem["reference"])


@pytest.mark.parametrize("masking", ["one_pass", "lockstep"])
def test_single_device_matches_reference(tiny_dir, problem, masking):
    module = MaskedLM(str(tiny_dir), problem["batches"], problem["masks"])
    _trainer(MaskedSingleDeviceStrategy(masking=masking)).fit(module)
    gap = _gap(_params(module), problem)
    assert gap <= 1e-6
    assert problem["plain_gap"] > 1000 * max(gap, 1e-9)


def test_single_device_without_masks_is_plain_training(tiny_dir, problem):
    module = MaskedLM(str(tiny_dir), problem["batches"], None)
    _trainer(MaskedSingleDeviceStrategy()).fit(module)
    assert relative_gap(_params(module), problem["plain"]) <= 1e-6


def _check_restricted(before: dict, after: dict, masks: dict) -> None:
    changed_inside = 0
    for name, old in before.items():
        allowed = group_mask(masks[name], [0, 1, 2])
        new = after[name]
        assert torch.equal(new[~allowed], old[~allowed]), f"{name} changed outside the mask"
        changed_inside += int((new[allowed] != old[allowed]).sum())
    assert changed_inside > 0


def test_restricted_update_keeps_out_of_mask_parameters_bit_for_bit(tiny_dir, problem):
    module = MaskedLM(
        str(tiny_dir),
        problem["batches"],
        problem["masks"],
        optimizer="adamw",
        lr=0.01,
        restrict_update_groups=[0, 1, 2],
    )
    before = _params(module)
    _trainer(MaskedSingleDeviceStrategy()).fit(module)
    _check_restricted(before, _params(module), problem["masks"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every multi-process training of this module as (strategy, nodes, restrict, extra worker flags, batches): `launched`
# trains them all in two launches of two processes (one per topology: 2 devices on 1 node, 1 device on each of 2
# nodes), each run after the other in the same process group, and the tests read their outputs.
BF16 = ("--precision", "bf16-mixed")
RUNS = [
    ("ddp", 1, False, (), "problem"),
    ("fsdp", 1, False, (), "problem"),
    ("fsdp", 1, False, ("--masking", "lockstep"), "problem"),
    ("fsdp", 2, False, ("--keep-unsharded",), "problem"),
    ("ddp", 2, False, (), "problem"),
    ("fsdp", 1, False, BF16, "all-groups"),
    ("fsdp", 1, False, (*BF16, "--masking", "lockstep"), "all-groups"),
    ("fsdp", 1, False, (*BF16, "--no-masks"), "all-groups"),
    ("ddp", 1, True, (), "problem"),
    ("fsdp", 1, True, (), "problem"),
    ("ddp", 1, False, ("--masking", "lockstep"), "problem"),
    ("ddp", 1, False, ("--accumulate", "2"), "problem"),
    ("ddp", 1, False, ("--masking", "lockstep", "--accumulate", "2"), "problem"),
    ("fsdp", 1, False, ("--accumulate", "2"), "problem"),
    ("fsdp", 1, False, ("--masking", "lockstep", "--accumulate", "2"), "problem"),
]


def _all_groups_batches(problem) -> list[dict]:
    """The problem's batches with every sample in a group (no neutral sample)."""
    return [dict(b, group_ids=torch.tensor([0, 1, 2, 3, 4, 5, 0, 1])) for b in problem["batches"]]


def _run_name(strategy: str, nodes: int, restrict: bool, extra: tuple[str, ...], data: str) -> str:
    return "-".join([strategy, str(nodes), str(restrict), *extra, data])


@pytest.fixture(scope="module")
def launched(tmp_path_factory, tiny_dir, problem) -> Path:
    """The folder holding one output folder per entry of RUNS (named by ``_run_name``)."""
    root = tmp_path_factory.mktemp("masked_runs")
    data = {"problem": problem["batches"], "all-groups": _all_groups_batches(problem)}
    for name, batches in data.items():
        torch.save({"masks": problem["masks"], "batches": batches}, root / f"{name}.pt")
    for nodes in (1, 2):
        runs = []
        for strategy, run_nodes, restrict, extra, batches in RUNS:
            if run_nodes != nodes:
                continue
            out = root / _run_name(strategy, nodes, restrict, extra, batches)
            out.mkdir()
            argv = [strategy, str(tiny_dir), str(root / f"{batches}.pt"), str(out), *extra]
            argv += ["--restrict"] if restrict else []
            argv += ["--devices", "1", "--num-nodes", str(nodes)] if nodes > 1 else []
            runs.append(argv)
        (root / f"runs-{nodes}.json").write_text(json.dumps(runs))
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1")
        env.pop("LOCAL_RANK", None)
        cmd = [sys.executable, str(WORKER), "--runs", str(root / f"runs-{nodes}.json")]
        # one node: Lightning's launcher starts rank 1; two nodes: one process per node
        envs = [env] if nodes == 1 else [dict(env, NODE_RANK=str(r)) for r in range(nodes)]
        procs = [subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for e in envs]
        for p in procs:
            log, _ = p.communicate(timeout=240 * len(runs))
            assert p.returncode == 0, log.decode()[-3000:]
    return root


def _run_dir(
    launched: Path,
    strategy,
    *,
    nodes: int = 1,
    restrict: bool = False,
    extra: tuple[str, ...] = (),
    batches: str = "problem",
) -> Path:
    """The output folder of that run of RUNS."""
    out = launched / _run_name(strategy, nodes, restrict, extra, batches)
    assert out.is_dir(), f"{out.name} is not in RUNS"
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("strategy", "nodes", "extra"),
    [
        ("ddp", 1, ()),
        ("fsdp", 1, ()),
        ("fsdp", 1, ("--masking", "lockstep")),
        ("fsdp", 2, ("--keep-unsharded",)),
        ("ddp", 2, ()),
    ],
    ids=["ddp", "fsdp-one-pass", "fsdp-lockstep", "fsdp-2nodes-unsharded-after-forward", "ddp-2nodes"],
)
def test_distributed_matches_reference(launched, problem, strategy, nodes, extra):
    out = _run_dir(launched, strategy, nodes=nodes, extra=extra)
    got = torch.load(out / "params.pt")
    gap = relative_gap(got, problem["reference"])
    assert gap <= 1e-6
    assert problem["plain_gap"] > 1000 * max(gap, 1e-9)
    infos = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(info["one_pass"] is ("lockstep" not in extra) for info in infos)
    if strategy == "fsdp":
        full_elements = sum(t.numel() for t in problem["reference"].values())
        largest = max(t.numel() for t in problem["reference"].values())
        for info in infos:
            # each rank persistently holds only its mask shard: 4 bytes (one uint32) per local parameter element
            assert info["mask_bytes"] == 4 * info["local_elements"]
            assert info["local_elements"] < 0.6 * full_elements
            if info["one_pass"]:
                # transiently, one parameter's full mask at a time (int32 rows padded to a multiple of 2 ranks)
                assert 0 < info["peak_gathered_bytes"] <= 4 * (largest + largest // 2)
                # every backward but the first of a step found its mask's gather started by the one before it
                prefetched, used = info["prefetched_gathers"]
                assert used > 0 and used - len(problem["batches"]) <= prefetched < used, info


@pytest.mark.multiprocess
def test_fsdp_one_pass_under_bf16_matches_lockstep_and_is_zero_outside_the_masks(launched, tiny_dir, problem):
    """bf16-mixed: one pass agrees with lockstep FSDP to bf16 tolerance; with no neutral sample in the batches, no
    weight outside the union of the present groups' masks moves at all (SGD, no weight decay)."""
    runs = {
        name: torch.load(_run_dir(launched, "fsdp", extra=flags, batches="all-groups") / "params.pt")
        for name, flags in {
            "one_pass": ("--precision", "bf16-mixed"),
            "lockstep": ("--precision", "bf16-mixed", "--masking", "lockstep"),
            "plain": ("--precision", "bf16-mixed", "--no-masks"),
        }.items()
    }
    before = {k: v for k, v in load_causal_lm(tiny_dir).state_dict().items() if k in runs["one_pass"]}
    gap = relative_gap(runs["one_pass"], runs["lockstep"])
    assert gap <= 2e-2
    assert relative_gap(runs["plain"], runs["lockstep"]) > 10 * max(gap, 1e-3)
    moved_inside = 0
    for name, old in before.items():
        inside = group_mask(problem["masks"][name], range(6))
        new = runs["one_pass"][name]
        assert torch.equal(new[~inside], old[~inside]), f"{name} moved outside the masks"
        moved_inside += int((new[inside] != old[inside]).sum())
    assert moved_inside > 0


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_distributed_restricted_update(launched, tiny_dir, problem, strategy):
    out = _run_dir(launched, strategy, restrict=True)
    assert all(json.loads((out / f"rank{r}.json").read_text())["one_pass"] for r in range(2))
    got = torch.load(out / "params.pt")
    before = {k: v for k, v in load_causal_lm(tiny_dir).state_dict().items() if k in got}
    _check_restricted(before, got, problem["masks"])


def test_rank0_weight_loading_detects_meta_models_and_refuses_them_on_rank_0(tiny_dir):
    """The collective check of MaskedFSDPStrategy.setup, in a one-process gloo group: a rank > 0 that built its model
    on the meta device turns the broadcast on; rank 0 on the meta device is refused (it has no weights to send)."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from lightning_unlearn.strategies import MaskedFSDPStrategy

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        check = MaskedFSDPStrategy._weights_from_rank0
        cpu = torch.device("cpu")
        loaded, skeleton = load_causal_lm(tiny_dir), load_causal_lm(tiny_dir, weights=False)
        assert all(p.is_meta for p in skeleton.parameters()) and not any(p.is_meta for p in loaded.parameters())
        assert check(SimpleNamespace(global_rank=0, root_device=cpu), loaded) is False
        assert check(SimpleNamespace(global_rank=1, root_device=cpu), skeleton) is True
        with pytest.raises(RuntimeError, match="rank 0 built its model on the meta device"):
            check(SimpleNamespace(global_rank=0, root_device=cpu), skeleton)
    finally:
        dist.destroy_process_group()


def test_lockstep_under_gradient_accumulation_matches_one_pass_in_every_hook(tiny_dir, problem):
    """Lockstep's gradients reach .grad through Lightning's own backward: on_after_backward and
    on_before_optimizer_step see what one pass gives, also when two batches accumulate."""
    from lightning.pytorch import Callback

    class Grads(Callback):
        def __init__(self):
            self.seen = []

        def on_after_backward(self, trainer, pl_module):
            self.seen.append({n: p.grad.clone() for n, p in pl_module.named_parameters()})

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.seen.append({n: p.grad.clone() for n, p in pl_module.named_parameters()})

    runs = {}
    for masking in ("one_pass", "lockstep"):
        module, grads = MaskedLM(str(tiny_dir), problem["batches"][:2] * 2, problem["masks"]), Grads()
        Trainer(
            accelerator="cpu",
            devices=1,
            strategy=MaskedSingleDeviceStrategy(masking=masking),
            max_steps=2,
            accumulate_grad_batches=2,
            callbacks=[grads],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            use_distributed_sampler=False,
        ).fit(module)
        runs[masking] = (grads.seen, _params(module))
    (one_pass_seen, one_pass_params), (lockstep_seen, lockstep_params) = runs["one_pass"], runs["lockstep"]
    assert len(lockstep_seen) == len(one_pass_seen) == 6  # per step: two backwards, one optimizer step
    for got, want in zip(lockstep_seen, one_pass_seen):
        assert relative_gap(got, want) <= 1e-6
    assert relative_gap(lockstep_params, one_pass_params) <= 1e-6
    assert relative_gap(one_pass_params, _params(MaskedLM(str(tiny_dir), [], None))) > 1e-3


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_distributed_gradient_accumulation_matches_one_process(tiny_dir, launched, problem, strategy):
    """Two batches accumulated into one step on 2 ranks (Lightning skips the gradient sync of the first): one pass
    and lockstep give the weights one process gives with the same accumulation."""
    module = MaskedLM(str(tiny_dir), problem["batches"], problem["masks"])
    _trainer(MaskedSingleDeviceStrategy(masking="one_pass"), steps=1, accumulate=2).fit(module)
    want = _params(module)
    assert relative_gap(want, _params(MaskedLM(str(tiny_dir), [], None))) > 1e-3
    for masking in ((), ("--masking", "lockstep")):
        out = _run_dir(launched, strategy, extra=(*masking, "--accumulate", "2"))
        assert relative_gap(torch.load(out / "params.pt"), want) <= 1e-6, masking


@pytest.mark.multiprocess
def test_ddp_lockstep_matches_reference(launched, problem):
    """Lockstep under DDP: each pass all-reduces one group's gradients, and the masked sum reaches .grad through the
    backward Lightning runs on the returned loss, outside any DDP forward."""
    out = _run_dir(launched, "ddp", extra=("--masking", "lockstep"))
    assert not any(json.loads((out / f"rank{r}.json").read_text())["one_pass"] for r in range(2))
    gap = relative_gap(torch.load(out / "params.pt"), problem["reference"])
    assert gap <= 1e-6
    assert problem["plain_gap"] > 1000 * max(gap, 1e-9)
