"""Time the exact mask AUC against one ``numpy.sort`` of the same scores, or score models from their files; JSON.

    .venv/bin/python benchmarks/mask_auc.py --weights 100000000 --tensors 50
    .venv/bin/python benchmarks/mask_auc.py --on-disk --weights 300000000 --tensors 100 --shards 8

In memory (the default), weights are split into ``--tensors`` equally sized score tensors (like a model's
parameters); 15% are positive (m^F of three 5% groups). The score vectors are generated up front (they stand in for
the model's weights that already live in memory); the report separates that baseline RSS from the peak reached
while computing the AUC, then times one ``numpy.sort`` of the same scores (concatenated outside the timing) and
gives the ratio. With ``--check`` a subsample is cross-checked against scikit-learn.

``--on-disk`` writes a synthetic θ_pre/θ_inj/θ_unl triple of ``--weights`` parameters each as sharded safetensors
(``model-0000i-of-0000n.safetensors`` and the index) plus a packed masks file (six 5% groups, the format
``masks.load_masks`` reads) into a temporary directory, in a child process, one shard at a time; then this process
scores them from the files with ``mask_auc`` (m^F = groups 0-2, m^F ∨ m^R = groups 0-5, as ``lightning-unlearn
mask-auc``) and reports the wall time and its peak RSS. The directory is deleted afterwards.

Each ``--buffer-mib`` value (default 256, ``mask_auc``'s) scores the files once more in a fresh process, so each
run's peak RSS is its own; ``none`` holds every score (no spill). In memory, ``--buffer-mib`` also times
``exact_auc`` spilling beyond each size, beside the held run and the sort.

    .venv/bin/python benchmarks/mask_auc.py --on-disk --weights 300000000 --tensors 100 --shards 8 --buffer-mib 256 none

``--on-disk --callback`` scores the same files the way the checkpoint callback does on rank 0 of a run
(``MaskAUCEvaluation.compute``): θ_unl is the evaluated model's own parameters, loaded into memory first (as a
training run holds them), and θ_pre, θ_inj and the masks are read from their files. The report gives the model's
bytes, the RSS before and the peak, so the callback's own cost is the peak minus the RSS before.

    .venv/bin/python benchmarks/mask_auc.py --on-disk --callback --weights 300000000 --tensors 100 --shards 8
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import resource
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

from lightning_unlearn.metrics.mask_auc import exact_auc

GiB = 2**30
COLUMNS = 1024  # every on-disk tensor is (rows, 1024)


def _rss_gib() -> float:
    return psutil.Process().memory_info().rss / GiB


def _peak_rss_gib(who: int = resource.RUSAGE_SELF) -> float:
    scale = GiB if sys.platform == "darwin" else 2**20  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(who).ru_maxrss / scale


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1")


def in_memory(args: argparse.Namespace) -> dict:
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
    peak = max(_peak_rss_gib(), peak_before)  # before the sort's copy below
    spilled = []
    for mib in args.buffer_mib or []:  # after the peak above: a spill's own peak is not separated here
        t0 = time.perf_counter()
        same = exact_auc(list(zip(scores, labels)), args.chunk_size, max_buffer_bytes=mib and int(mib * 2**20)) == auc
        spilled.append({"buffer_mib": mib, "seconds": round(time.perf_counter() - t0, 2), "same_auc": same})
    flat = torch.cat(scores).numpy()
    t0 = time.perf_counter()
    flat.sort()
    sort_seconds = time.perf_counter() - t0
    del flat
    for run in spilled:
        run["seconds_over_sort"] = round(run["seconds"] / sort_seconds, 3)
    out = {
        "mode": "in_memory",
        "weights": per * args.tensors,
        "tensors": args.tensors,
        "auc": auc,
        "seconds": round(seconds, 2),
        "sort_seconds": round(sort_seconds, 2),
        "seconds_over_sort": round(seconds / sort_seconds, 3),
        "weights_per_second": round(per * args.tensors / seconds),
        "input_bytes_gib": round(per * args.tensors * 5 / GiB, 3),  # float32 scores + bool labels
        "rss_before_gib": round(baseline, 3),
        "peak_rss_gib": round(peak, 3),
        "peak_rss_over_inputs_gib": round(peak - baseline, 3),
        "threads": args.threads,
        "spilled": spilled,  # --buffer-mib: exact_auc with max_buffer_bytes, the same scores
    }
    if args.check:
        from sklearn.metrics import roc_auc_score

        s = torch.cat(scores)[: args.check]
        y = torch.cat(labels)[: args.check]
        out["check_abs_diff"] = abs(exact_auc([(s, y)]) - roc_auc_score(y.numpy(), s.numpy()))
    return out


def _layout(weights: int, tensors: int, shards: int) -> list[list[tuple[str, tuple[int, int]]]]:
    """Tensor names and shapes, shard by shard (contiguous runs of tensors, in order)."""
    rows = max(weights // tensors // COLUMNS, 1)
    names = [(f"model.layers.{i}.mlp.down_proj.weight", (rows, COLUMNS)) for i in range(tensors)]
    per_shard = math.ceil(tensors / shards)
    return [names[s : s + per_shard] for s in range(0, tensors, per_shard)]


def _write_masks_header(fh, entries: list[tuple[str, tuple[int, int]]]) -> None:
    # One safetensors file written tensor by tensor: the header (uint32 shapes give every offset) first.
    header, offset = {}, 0
    for name, shape in entries:
        size = math.prod(shape) * 4
        header[name] = {"dtype": "U32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    fh.write(struct.pack("<Q", len(blob)) + blob)


def _generate(root: str, weights: int, tensors: int, shards: int) -> None:
    """θ_pre, θ_inj, θ_unl and the masks of the layout; one shard of the three models in memory at a time."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    layout = _layout(weights, tensors, shards)
    dirs = {what: Path(root, what) for what in ("pre", "inj", "unl")}
    for d in dirs.values():
        d.mkdir(parents=True)
    weight_map = {}
    with open(Path(root, "masks.safetensors"), "wb") as masks_file:
        _write_masks_header(masks_file, [e for shard in layout for e in shard])
        for s, shard in enumerate(layout):
            file = f"model-{s + 1:05d}-of-{len(layout):05d}.safetensors"
            models: dict[str, dict[str, torch.Tensor]] = {what: {} for what in dirs}
            for name, shape in shard:
                g = torch.Generator().manual_seed(int(name.split(".")[2]))
                group = torch.floor(torch.rand(shape, generator=g) / 0.05).to(torch.int64)  # ≥ 6: no group
                in_group, forget = group < 6, group < 3
                bits = torch.where(in_group, torch.ones_like(group) << group.clamp(max=31), 0).to(torch.uint32)
                masks_file.write(bits.numpy().data)
                pre = torch.randn(shape, generator=g)
                d_inj = torch.randn(shape, generator=g) * 0.01 * (1 + 2 * in_group)  # neutral text moves all
                inj = pre + d_inj
                unl = inj + torch.randn(shape, generator=g) * 1e-3 - 0.8 * d_inj * forget  # reverses m^F
                models["pre"][name], models["inj"][name], models["unl"][name] = pre, inj, unl
                weight_map[name] = file
                del group, in_group, forget, bits, d_inj
            for what, tensors_of_shard in models.items():
                save_file(tensors_of_shard, str(dirs[what] / file))
            del models
    for d in dirs.values():
        index = {"metadata": {"total_size": sum(f.stat().st_size for f in d.iterdir())}, "weight_map": weight_map}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))


def _model_of(directory: Path) -> torch.nn.Module:
    """A module whose parameters are the checkpoint's tensors, named as in its files (``model.layers.i...``)."""
    from safetensors import safe_open

    root = torch.nn.Module()
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                *path, leaf = name.split(".")
                module = root
                for part in path:
                    if not hasattr(module, part):
                        module.add_module(part, torch.nn.Module())
                    module = getattr(module, part)
                module.register_parameter(leaf, torch.nn.Parameter(f.get_tensor(name), requires_grad=False))
    return root


def _callback(root: Path, args: argparse.Namespace, buffer_mib: float | None) -> tuple[dict, float, float, float]:
    """``MaskAUCEvaluation.compute`` on θ_unl held in memory: (result, seconds, RSS before, model GiB)."""
    from types import SimpleNamespace

    from lightning_unlearn.callbacks import MaskAUCEvaluation

    model = _model_of(root / "unl")
    model_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / GiB
    evaluator = MaskAUCEvaluation(
        str(root / "pre"),
        str(root / "inj"),
        str(root / "masks.safetensors"),
        retain_groups=(3, 4, 5) if args.unified else (),
        max_samples=args.max_samples,
        composite=args.composite,
        buffer_mib=buffer_mib,
        spill_dir=args.dir,
    )
    baseline = _rss_gib()
    t0 = time.perf_counter()
    result = evaluator.compute(None, SimpleNamespace(model=model), 0)
    return {**result, "F|R": result.get("F_or_R")}, time.perf_counter() - t0, baseline, model_gib


def _score(root: Path, args: argparse.Namespace, buffer_mib: float | None, queue) -> None:
    """One scoring of the files (a fresh process, so its peak RSS is its own); puts its report on ``queue``."""
    from lightning_unlearn.masks import load_masks, union_mask
    from lightning_unlearn.metrics.mask_auc import mask_auc

    torch.set_num_threads(args.threads)
    model_gib = None
    if args.callback:
        result, seconds, baseline, model_gib = _callback(root, args, buffer_mib)
    else:
        packed, _ = load_masks(root / "masks.safetensors", lazy=True)
        baseline = _rss_gib()
        t0 = time.perf_counter()
        result = mask_auc(
            root / "pre",
            root / "inj",
            root / "unl",
            union_mask(packed, [0, 1, 2], lazy=True),
            unified_mask=union_mask(packed, range(6), lazy=True) if args.unified else None,
            max_samples=args.max_samples,
            composite=args.composite,
            buffer_mib=buffer_mib,
            spill_dir=args.dir,
        )
        seconds = time.perf_counter() - t0
    queue.put(
        {
            "buffer_mib": buffer_mib,  # None: every score held (no spill)
            "model_gib": None if model_gib is None else round(model_gib, 3),  # --callback: θ_unl held in memory
            "seconds": round(seconds, 1),
            "rss_before_gib": round(baseline, 3),
            "peak_rss_gib": round(_peak_rss_gib(), 3),
            "weights": result["num_weights"],
            "num_subsampled": result.get("num_subsampled"),
            "F": result["F"],
            "F|R": result.get("F|R"),
        }
    )


def on_disk(args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mask_auc_bench_", dir=args.dir))
    context = multiprocessing.get_context("spawn")
    runs = []
    try:
        t0 = time.perf_counter()
        child = context.Process(target=_generate, args=(str(root), args.weights, args.tensors, args.shards))
        child.start()
        child.join()
        if child.exitcode != 0:
            raise RuntimeError(f"generating the models failed (exit code {child.exitcode}).")
        write_seconds = time.perf_counter() - t0
        generation_peak = _peak_rss_gib(resource.RUSAGE_CHILDREN)
        files_gib = sum(f.stat().st_size for f in root.rglob("*.safetensors")) / GiB
        for buffer_mib in args.buffer_mib or [256]:
            queue = context.Queue()
            child = context.Process(target=_score, args=(root, args, buffer_mib, queue))
            child.start()
            runs.append(queue.get())
            child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"scoring the models failed (exit code {child.exitcode}).")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    weights = runs[0]["weights"]
    return {
        "mode": "callback" if args.callback else "on_disk",
        "weights": weights,
        "tensors": args.tensors,
        "shards": args.shards,
        "files_gib": round(files_gib, 3),  # θ_pre, θ_inj, θ_unl (fp32) and the uint32 masks
        "write_seconds": round(write_seconds, 1),
        "generation_peak_rss_gib": round(generation_peak, 3),
        "scores_gib": round(weights * 4 / GiB, 3),  # every score once, float32 (held whole without a buffer limit)
        "composite": args.composite,
        "unified": args.unified,
        "threads": args.threads,
        "same_result": all((r["F"], r["F|R"]) == (runs[0]["F"], runs[0]["F|R"]) for r in runs),
        "runs": runs,  # one per --buffer-mib, in that order, each in its own process
    }


def _buffer_mib(text: str) -> float | None:
    if text.lower() == "none":
        return None
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive size in MiB or none, got {text!r}")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=int, default=100_000_000, help="scores (in memory) or parameters per model")
    ap.add_argument("--tensors", type=int, default=50)
    ap.add_argument("--positive-rate", type=float, default=0.15)
    ap.add_argument("--chunk-size", type=int, default=1 << 16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--check", type=int, default=0, help="cross-check this many leading weights with sklearn")
    ap.add_argument("--on-disk", action="store_true", help="write a model triple to files and score it from them")
    ap.add_argument("--shards", type=int, default=8, help="--on-disk: safetensors shards per model")
    ap.add_argument("--composite", type=_bool, default=True, help="--on-disk: fit the composite classifier")
    ap.add_argument("--unified", type=_bool, default=True, help="--on-disk: also score against m^F ∨ m^R")
    ap.add_argument("--max-samples", type=int, default=2_000_000, help="--on-disk: the composite's subsample")
    ap.add_argument("--callback", action="store_true", help="--on-disk: score as MaskAUCEvaluation on rank 0 does")
    ap.add_argument("--dir", default=None, help="--on-disk: parent of the temporary directories (default: $TMPDIR)")
    ap.add_argument(
        "--buffer-mib",
        type=_buffer_mib,
        nargs="+",
        default=None,
        help="mask_auc's buffer_mib, one scoring each (none: every score held, no spill); --on-disk default 256."
        " In memory: also time exact_auc spilling beyond each size",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.callback and not args.on_disk:
        ap.error("--callback scores the files --on-disk writes; add --on-disk.")
    print(json.dumps(on_disk(args) if args.on_disk else in_memory(args)))


if __name__ == "__main__":
    main()
