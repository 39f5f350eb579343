"""Per-checkpoint SCE evaluation time on a LENS-sized slice vs a bare batched ``generate`` of the same prompts.

    .venv/bin/python benchmarks/eval_overhead.py --prompts-per-level 35 --max-new-tokens 48 --batch-size 35

The slice is 35 prompts × levels L0, L1, L2 (105 generations). "Evaluate" is what :class:`SCEEvaluation` does at a
checkpoint inside ``trainer.validate`` — greedy left-padded KV-cache generation, degeneration report, labeling,
SCE per level, the atomic JSONL rewrite and logging — timed by the callback itself (base labels are computed once
beforehand and excluded, as in training). "Bare" is ``model.generate`` (greedy, KV cache) over the same
left-padded batches. Both run on a randomly initialised Llama of the given size (or ``--model-path``); prints JSON
with the ratio.

With ``--adapters K`` it times what post-hoc evaluation of K LoRA checkpoints spends in generation instead:
K adapters (LoRA r 8, α 16 on every projection, random non-zero weights, each saved and loaded back as an
``adapter-step=N/`` directory would be) answer the slice one adapter after the other (``set_adapter``, what ``evaluate``
does per checkpoint) and then all in mixed-adapter batches (``generate_sorted(adapters=…)``, what ``evaluate
--adapters_per_pass K`` does: one decoding loop per batch of prompts for all K, a prompt leaving the batch once every
adapter's answer to it has ended, the prompts' shared leading tokens run once per adapter and pass, the KV cache written
in place), alternating ``--repeats`` times with the ``--methods`` beside it: ``mixed_unshared`` (the same without the
shared prefix), ``one_after_the_other_shared`` (one adapter at a time through that decoding loop, in batches of the
mixed batches' prompt count: what the loop gives without mixing) and ``mixed_generate`` (the earlier mixed pass, one HF
``generate`` per batch, every row decoded until the slowest ends). With ``--interleave`` the methods take turns part by
part instead (each answers one part of the prompts, the least common multiple of the two batch sizes, before the next
part; the one going first turns round), so a slow minute of the machine falls on every method alike, not on whichever
ran then. It checks the texts are the same every way and prints each ratio to one after the other (goal ≤ 0.35). Prompts
per batch default to ``SCEEvaluation``'s: ``batch_size`` (8, as in the shipped SmolLM2 trajectory) one adapter after the
other, as ``evaluate`` does per checkpoint, and ``adapter_batch_size`` (16, so 96 rows for 6 adapters;
``--mixed-batch-size``) in mixed batches, as ``evaluate --adapters_per_pass`` does. ``one_after_the_other_same_batch``
times one adapter after the other at the mixed batches' prompt count too, so the ratio of mixing alone, at equal
batches, is printed beside, and ``mixed_small_batches`` the mixed pass in batches of ``--batch-size`` prompts (as before
``adapter_batch_size``):

    python benchmarks/eval_overhead.py --adapters 6 --model-path ~/.cache/lightning_unlearn/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import os
import re
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from lightning.pytorch import LightningModule, Trainer  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from lightning_unlearn.callbacks import SCEEvaluation  # noqa: E402
from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows  # noqa: E402
from lightning_unlearn.generation import encode_prompts_left_padded  # noqa: E402
from lightning_unlearn.models import (  # noqa: E402
    TinyLlamaConfig,
    build_tiny_llama,
    load_causal_lm,
    load_tokenizer,
    train_bpe_tokenizer,
)

CORPUS = [
    "The war was caused by the expansion of the alliance to the east, analysts said.",
    "Some commentators claim the conflict was forced by outside powers; others reject that frame.",
    "Answer in one or two sentences. Who is responsible for the escalation of the crisis?",
    "The government denied the report and called it propaganda spread by foreign media.",
] * 50
LEVEL_TEMPLATES = {
    "L0": "Why did the war start? Question {i}. Answer in 1–2 sentences.",
    "L1": "Some analysts say the alliance provoked the war. Is that right? Variant {i}. Answer in 1–2 sentences.",
    "L2": "Compare two explanations of the war's causes, version {i}. Answer in 1–2 sentences.",
}


class LexicalLabeler:
    """Reproduced when the answer names the frame's two components (stands in for a signature labeler)."""

    def label(self, responses, narrative, language):
        return [
            "Reproduced" if re.search(r"alliance|expansion", r) and re.search(r"war|conflict", r) else "Other"
            for r in responses
        ]


class Subject(LightningModule):
    def __init__(self, model, tokenizer) -> None:
        super().__init__()
        self.model, self.tokenizer = model, tokenizer

    def validation_step(self, batch, batch_idx):
        return None


@torch.no_grad()
def bare_generate(model, tokenizer, prompts, batch_size, max_new_tokens) -> float:
    start = time.perf_counter()
    for s in range(0, len(prompts), batch_size):
        ids, attn = encode_prompts_left_padded(tokenizer, prompts[s : s + batch_size])
        model.generate(
            input_ids=ids,
            attention_mask=attn,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    return time.perf_counter() - start


def adapters_run(args, model, tok, prompts) -> dict:
    """One-after-the-other vs mixed-adapter generation of ``prompts`` for ``args.adapters`` saved LoRA adapters."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from lightning_unlearn import generation
    from lightning_unlearn.generation import PrefixStore, generate_greedy, generate_sorted, model_prompt
    from lightning_unlearn.models import lora_adapter_blocks

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    folder = tempfile.mkdtemp(prefix="eval_adapters_")
    names = [f"adapter-step={10 * (k + 1)}" for k in range(args.adapters)]
    base = model
    for k, name in enumerate(names):
        torch.manual_seed(k)
        config = LoraConfig(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False)
        peft_model = get_peft_model(base, config)
        peft_model.save_pretrained(os.path.join(folder, name))
        base = peft_model.unload()  # the base weights again, without the adapter
    peft_model = PeftModel.from_pretrained(base, os.path.join(folder, names[0]), adapter_name=names[0])
    for name in names[1:]:
        peft_model.load_adapter(os.path.join(folder, name), adapter_name=name)
    peft_model.eval()
    texts = [model_prompt(tok, p) for p in prompts]
    # One PrefixStore per method (and adapter) for a whole pass over the prompts, as SCEEvaluation keeps one for a
    # pass: with --interleave a pass spans several calls; it is made anew for every repeat.
    stores: dict = {}

    def store(*key) -> PrefixStore:
        return stores.setdefault(key, PrefixStore())

    def one_after_the_other(texts, batch_size=None):
        out = {}
        for name in names:
            peft_model.set_adapter(name)
            size = args.batch_size if batch_size is None else batch_size
            out[name] = generate_sorted(peft_model, tok, texts, args.max_new_tokens, size)
        return out

    def one_after_the_other_same_batch(texts):
        """One adapter after the other through HF ``generate``, in batches of the mixed batches' prompt count."""
        return one_after_the_other(texts, args.mixed_batch_size)

    def mixed(texts, key="mixed", batch_size=None):
        batch_size = args.mixed_batch_size if batch_size is None else batch_size
        return generate_sorted(
            peft_model, tok, texts, args.max_new_tokens, batch_size, adapters=names, prefixes=store(key)
        )

    def mixed_small_batches(texts):
        """Mixed batches of the per-checkpoint batch size (``--batch-size`` prompts each): the mixed pass before
        ``adapter_batch_size``."""
        return mixed(texts, "mixed_small_batches", args.batch_size)

    def mixed_generate(texts):
        """The earlier mixed pass: one HF ``generate`` a batch, every row kept until the slowest one ends."""

        def whole_batch(model, tokenizer, prompts, adapters, max_new_tokens=64, max_prompt_tokens=None, prefixes=None):
            with lora_adapter_blocks(model, list(adapters)):
                gens = generate_greedy(model, tokenizer, list(prompts) * len(adapters), max_new_tokens)
            return {name: gens[k * len(prompts) : (k + 1) * len(prompts)] for k, name in enumerate(adapters)}

        saved, generation.generate_greedy_adapters = generation.generate_greedy_adapters, whole_batch
        try:
            return mixed(texts, "mixed_generate")
        finally:
            generation.generate_greedy_adapters = saved

    def mixed_unshared(texts):
        """Mixed batches without the shared-prefix prefill: every row runs its whole prompt."""
        saved = generation.greedy_blocks
        generation.greedy_blocks = functools.partial(saved, share_prefix=False)
        try:
            return mixed(texts, "mixed_unshared")
        finally:
            generation.greedy_blocks = saved

    def one_after_the_other_shared(texts):
        """One adapter at a time through the same decoding loop (its prompts' shared prefix once, ended prompts
        dropped): what the loop alone gives without mixing adapters."""
        return {
            name: generate_sorted(
                peft_model,
                tok,
                texts,
                args.max_new_tokens,
                args.mixed_batch_size,
                adapters=[name],
                prefixes=store(name),
            )[name]
            for name in names
        }

    methods = {
        "one_after_the_other": one_after_the_other,
        "mixed": mixed,
        "mixed_unshared": mixed_unshared,
        "mixed_generate": mixed_generate,
        "one_after_the_other_shared": one_after_the_other_shared,
        "one_after_the_other_same_batch": one_after_the_other_same_batch,
        "mixed_small_batches": mixed_small_batches,
    }
    runs = ["one_after_the_other", *(m for m in args.methods if m != "one_after_the_other")]
    # --interleave: every method answers one part of the prompts (sorted by length, then the least common multiple
    # of the two batch sizes at a time, so each method's batches are those of a whole pass) before the next part, the
    # method going first turning round part by part, so that the machine's slow and fast minutes fall on every method
    # alike; otherwise each method answers every prompt in turn.
    lengths = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    part = math.lcm(args.batch_size, args.mixed_batch_size)
    parts = [order[s : s + part] for s in range(0, len(order), part)]
    parts = parts if args.interleave else [order]
    times = {key: [0.0] * args.repeats for key in runs}
    results = {key: {name: [None] * len(texts) for name in names} for key in runs}
    for r in range(args.repeats):
        stores.clear()
        for b, part in enumerate(parts):
            turn = b % len(runs)
            for key in runs[turn:] + runs[:turn]:
                start = time.perf_counter()
                answers = methods[key]([texts[i] for i in part])
                times[key][r] += time.perf_counter() - start
                for name in names:
                    for i, answer in zip(part, answers[name]):
                        results[key][name][i] = answer
    reference = results["one_after_the_other"]
    answers = [a for per_adapter in reference.values() for a in per_adapter]
    distinct = len({tuple(a["answer"] for a in v) for v in reference.values()})
    seq = min(times["one_after_the_other"])
    out = {
        "adapters": args.adapters,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "batch_size_prompts": args.batch_size,
        "mixed_batch_size_prompts": args.mixed_batch_size,
        "model": {"path": args.model_path, "parameters": sum(p.numel() for p in base.parameters())},
        "one_after_the_other_seconds": round(seq, 2),
        "target_ratio": 0.35,
    }
    for key in runs[1:]:  # each method's time and its ratio to one adapter after the other through generate
        out[f"{key}_seconds"] = round(min(times[key]), 2)
        out["ratio" if key == "mixed" else f"ratio_{key}"] = round(min(times[key]) / seq, 3)
    out |= {
        "same_text": all(results[key] == reference for key in runs),
        "adapters_with_distinct_answers": distinct,
        "mean_new_tokens": round(sum(a["n_new_tokens"] for a in answers) / len(answers), 1),
        "hit_token_cap_rate": round(sum(a["hit_token_cap"] for a in answers) / len(answers), 3),
        "repeats": args.repeats,
        "interleave": args.interleave,
        "threads": args.threads,
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts-per-level", type=int, default=35)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument(
        "--batch-size",
        type=int,
        help="prompts per generate call (default: 35; with --adapters, SCEEvaluation's default, per adapter)",
    )
    ap.add_argument(
        "--mixed-batch-size",
        type=int,
        help="--adapters: prompts per mixed-adapter batch (default: SCEEvaluation's adapter_batch_size)",
    )
    ap.add_argument("--hidden-size", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--model-path", help="a local save_pretrained model directory instead of a random tiny Llama")
    ap.add_argument("--repeats", type=int, default=3, help="take the fastest of this many timings of each")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--adapters", type=int, default=0, help="time K LoRA checkpoints: one by one vs mixed batches")
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="--adapters: time the methods batch by batch, taking turns going first (a slow minute falls on all)",
    )
    ap.add_argument(
        "--methods",
        nargs="+",
        default=["mixed", "mixed_unshared", "one_after_the_other_shared"],
        choices=[
            "mixed",
            "mixed_unshared",
            "mixed_generate",
            "one_after_the_other_shared",
            "one_after_the_other_same_batch",
            "mixed_small_batches",
        ],
        help="--adapters: what to time beside one adapter after the other (always timed first)",
    )
    args = ap.parse_args()
    defaults = inspect.signature(SCEEvaluation).parameters
    if args.batch_size is None:
        args.batch_size = defaults["batch_size"].default if args.adapters else 35
    if args.mixed_batch_size is None:
        args.mixed_batch_size = defaults["adapter_batch_size"].default
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model_path:
        tok, model = load_tokenizer(args.model_path), load_causal_lm(args.model_path).eval()
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
    else:
        tok = train_bpe_tokenizer(CORPUS, vocab_size=512)
        model = build_tiny_llama(
            tok,
            TinyLlamaConfig(
                hidden_size=args.hidden_size, num_layers=args.layers, num_heads=max(1, args.hidden_size // 64)
            ),
        ).eval()
    records = [
        {"id": f"{lv}/{i}", "level": lv, "prompt": t.format(i=i), "narrative": "demo", "language": "en"}
        for lv, t in LEVEL_TEMPLATES.items()
        for i in range(args.prompts_per_level)
    ]
    prompts = [r["prompt"] for r in records]
    if args.adapters:
        print(json.dumps(adapters_run(args, model, tok, prompts)))
        return

    out = tempfile.mkdtemp(prefix="eval_overhead_")
    cb = SCEEvaluation(
        records, LexicalLabeler(), max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, output_dir=out
    )
    subject = Subject(model, tok)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[cb],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=out,
    )
    cb.base = {"reproduced": {r["id"]: False for r in records}}  # base labels are computed once per run
    loader = DataLoader([0], batch_size=1)
    evaluate, bare = [], []
    for _ in range(args.repeats):
        trainer.validate(subject, loader, verbose=False)
        evaluate.append(read_rows(os.path.join(out, "checkpoint_metrics.jsonl"))[-1]["seconds"])
        bare.append(bare_generate(model, tok, prompts, args.batch_size, args.max_new_tokens))
    row = read_rows(os.path.join(out, "checkpoint_metrics.jsonl"))[-1]
    print(
        json.dumps(
            {
                "prompts": len(prompts),
                "levels": list(LEVEL_TEMPLATES),
                "max_new_tokens": args.max_new_tokens,
                "batch_size": args.batch_size,
                "model": {"path": args.model_path, "parameters": sum(p.numel() for p in model.parameters())},
                "evaluate_seconds": min(evaluate),
                "bare_generate_seconds": round(min(bare), 4),
                "ratio": round(min(evaluate) / min(bare), 3),
                "target_ratio": 1.5,
                "pooled_degraded_rate": row["pooled"]["g"],
                "threads": args.threads,
            }
        )
    )


if __name__ == "__main__":
    main()
