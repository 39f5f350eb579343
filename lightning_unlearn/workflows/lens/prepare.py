"""LENS workflow steps before unlearning: base answers, annotation, forget set, labeler calibration.

Library functions (usable from a LightningModule or callback):

- :func:`generate_answers` / :func:`generate_for_records`: batched, left-padded, greedy generation of answers to
  suite prompts (rendered by :func:`lightning_unlearn.generation.model_prompt`, the chat template applied when the
  tokenizer has one), on top of :func:`lightning_unlearn.generation.generate_greedy`.
- :func:`make_labeler`, :func:`label_rows`, :func:`summarize_by_level`.
- :func:`build_forget_rows`: the strict (Target-Dominant) or weak-label forget set as ``{prompt, answer}``.

Commands (``lightning-unlearn <name> --help``):

- ``lens-baseline``: generate base answers to a suite under a condition → JSONL (+ ``.meta.json``).
- ``lens-export``: the L0 answers as a CSV for annotators (``label`` column to fill).
- ``lens-import``: annotated CSV (or a labeler, marked ``weak_labels: true``) → forget-set JSONL + metadata.
- ``lens-label``: label a baseline file with a labeler and print Reproduced counts per level.
- ``lens-calibrate``: a labeler's predictions vs manual labels, printed like LENS Table 8.

The forget set's ``prompt`` is exactly the text the model was prompted with (chat-rendered, without the leading
BOS token, which ``encode_prompt_answer`` adds back), so unlearning sees the same context as generation.
Every command validates its inputs before doing work and writes its outputs atomically; bad input writes nothing.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import torch

from lightning_unlearn.data.narratives import CONDITIONS, LEVELS, PromptRecord, load_suite
from lightning_unlearn.generation import generate_greedy, model_prompt
from lightning_unlearn.labelers.calibration import calibration_report, format_calibration_table
from lightning_unlearn.labelers.manual_labels import TARGET_DOMINANT, ManualLabels
from lightning_unlearn.labelers.narrative_label import INVALID, REPRODUCED, NarrativeLabel, NarrativeLabeler
from lightning_unlearn.labelers.nli_labeler import NLILabeler
from lightning_unlearn.labelers.signature_labeler import SignatureLabeler

LABELERS = ("signature", "nli")
FORGET_LEVELS = ("L0",)
EXPORT_COLUMNS = (
    "id",
    "narrative",
    "language",
    "level",
    "variant",
    "condition",
    "question",
    "answer",
    "label",
    "notes",
)


# ----------------------------------------------------------------------------------------------- generation
@torch.no_grad()
def _generate(
    model, tokenizer, texts: Sequence[str], max_new_tokens: int, batch_size: int, synced_gpus: bool = False
) -> list[dict]:
    if max_new_tokens < 1 or batch_size < 1:
        raise ValueError(f"max_new_tokens and batch_size must be positive, got {max_new_tokens}, {batch_size}.")
    # Similar lengths in a batch waste less left padding; results go back in the caller's order.
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    was_training = model.training
    model.eval()
    results: list[dict | None] = [None] * len(texts)
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = [texts[i] for i in idx]
            gens = generate_greedy(model, tokenizer, batch, max_new_tokens=max_new_tokens, synced_gpus=synced_gpus)
            for i, gen in zip(idx, gens):
                results[i] = {"answer": gen.text, "n_new_tokens": gen.num_tokens, "hit_token_cap": gen.hit_token_cap}
    finally:
        model.train(was_training)
    return results


def generate_answers(
    model,
    tokenizer,
    questions: Sequence[str],
    max_new_tokens: int = 60,
    batch_size: int = 8,
    chat_template: bool | None = None,
) -> list[str]:
    """Greedy answers to ``questions``, batched with left padding (the model's train/eval mode is restored).

    Args:
        model: a causal LM (plain transformers or peft-wrapped).
        tokenizer: its tokenizer.
        questions: suite prompts.
        max_new_tokens: generation cap per answer.
        batch_size: prompts per ``generate`` call.
        chat_template: see :func:`model_prompt`.
    """
    texts = [model_prompt(tokenizer, q, chat_template) for q in questions]
    return [r["answer"] for r in _generate(model, tokenizer, texts, max_new_tokens, batch_size)]


def generate_for_records(
    model,
    tokenizer,
    records: Sequence[PromptRecord],
    max_new_tokens: int = 60,
    batch_size: int = 8,
    chat_template: bool | None = None,
    synced_gpus: bool = False,
) -> list[dict]:
    """One row per suite record: the record's fields plus ``question`` (suite prompt), ``prompt`` (model prompt),
    ``answer``, ``n_new_tokens`` and ``hit_token_cap`` (no EOS before the cap; a degeneration flag).

    ``synced_gpus=True`` is needed when parameters are sharded (FSDP): every rank must call with the same number of
    batches. Rows feed :func:`label_rows` directly.
    """
    texts = [model_prompt(tokenizer, r.prompt, chat_template) for r in records]
    gens = _generate(model, tokenizer, texts, max_new_tokens, batch_size, synced_gpus)
    rows = []
    for rec, text, gen in zip(records, texts, gens):
        row = rec.to_dict()
        row["question"] = row.pop("prompt")
        row["prompt"] = text
        row.update(gen)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------- labeling
def make_labeler(
    name: str, nli_path: str | None = None, entail_threshold: float = 0.7, margin: float = 0.2
) -> SignatureLabeler | NLILabeler:
    """``"signature"`` (offline default) or ``"nli"`` (needs a local ``nli_path``); errors name the fix."""
    if name == "signature":
        return SignatureLabeler()
    if name == "nli":
        if not nli_path:
            raise ValueError("labeler 'nli' needs --nli-path pointing at a local NLI model directory.")
        return NLILabeler(nli_path, entail_threshold=entail_threshold, margin=margin)
    raise ValueError(f"unknown labeler {name!r}; use one of {', '.join(LABELERS)}.")


def label_rows(rows: Sequence[dict], labeler: NarrativeLabeler) -> list[NarrativeLabel]:
    """Labels for baseline rows (grouped by narrative × language so each suite is loaded once), in row order."""
    labels: list[NarrativeLabel | None] = [None] * len(rows)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r["narrative"], r["language"]), []).append(i)
    for (narrative, language), idx in groups.items():
        out = labeler.label([rows[i]["answer"] for i in idx], narrative, language, [rows[i]["level"] for i in idx])
        for i, lbl in zip(idx, out):
            labels[i] = lbl
    return labels


def with_labels(rows: Sequence[dict], labels: Sequence[NarrativeLabel], labeler_name: str) -> list[dict]:
    """Rows with ``label``, ``stance``, ``entity_recovery``, ``actors`` and ``labeler`` fields added."""
    out = []
    for row, lbl in zip(rows, labels):
        out.append(
            {
                **row,
                "label": lbl.label,
                "stance": lbl.stance,
                "entity_recovery": lbl.entity_recovery,
                "actors": list(lbl.actors),
                "labeler": labeler_name,
            }
        )
    return out


def summarize_by_level(rows: Sequence[dict]) -> dict[str, dict[str, int]]:
    """Per level: ``n``, ``reproduced``, ``invalid``, ``entity_recovery`` counts of labeled rows."""
    summary: dict[str, dict[str, int]] = {}
    for lvl in LEVELS:
        sel = [r for r in rows if r["level"] == lvl]
        if sel:
            summary[lvl] = {
                "n": len(sel),
                "reproduced": sum(r["label"] == REPRODUCED for r in sel),
                "invalid": sum(r["label"] == INVALID for r in sel),
                "entity_recovery": sum(bool(r.get("entity_recovery")) for r in sel),
            }
    return summary


def format_level_summary(summary: dict[str, dict[str, int]]) -> str:
    lines = [f"{'level':<11}{'n':>4}{'Reproduced':>12}{'Invalid':>9}{'entity recovery':>17}"]
    for lvl, s in summary.items():
        lines.append(f"{lvl:<11}{s['n']:>4}{s['reproduced']:>12}{s['invalid']:>9}{s['entity_recovery']:>17}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ forget set
def build_forget_rows(rows: Sequence[dict], keep: Iterable[bool]) -> list[dict]:
    """``{prompt, answer, id, question}`` for the rows flagged in ``keep`` (the format the objectives read)."""
    return [
        {"prompt": r["prompt"], "answer": r["answer"], "id": r["id"], "question": r.get("question", r["prompt"])}
        for r, k in zip(rows, keep)
        if k
    ]


# ---------------------------------------------------------------------------------------------------- files
def read_jsonl(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{str(p)!r} does not exist.")
    with open(p, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def meta_path(path: str | Path) -> Path:
    """The metadata sidecar of an output file: ``forget.jsonl`` → ``forget.meta.json``."""
    p = Path(path)
    return p.with_name(p.name.rsplit(".", 1)[0] + ".meta.json") if "." in p.name else p.with_name(p.name + ".meta.json")


def write_atomic(files: dict[Path, str]) -> None:
    """Write every file to a temporary sibling first, then rename all into place."""
    staged = []
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            staged.append((tmp, path))
    except BaseException:
        for tmp, _ in staged:
            os.unlink(tmp)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)


def _jsonl(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _resolve_model_path(model: str) -> str:
    if model == "smollm2":
        from lightning_unlearn.smollm2 import smollm2_path

        return str(smollm2_path())
    return model


# ------------------------------------------------------------------------------------------------- commands
def _labeler_args(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument("--labeler", choices=LABELERS, default=default, help="weak labeler (default: %(default)s)")
    parser.add_argument("--nli-path", default=None, help="local NLI model directory (labeler 'nli')")
    parser.add_argument("--entail-threshold", type=float, default=0.7, help="NLI entailment threshold")
    parser.add_argument("--margin", type=float, default=0.2, help="NLI separation margin")


def _labeler_from(args):
    if args.labeler is None:
        return None
    if args.labeler == "nli":
        return make_labeler("nli", args.nli_path, entail_threshold=args.entail_threshold, margin=args.margin)
    return make_labeler(args.labeler)


def baseline_main(argv: list[str] | None = None) -> None:
    """Generate base answers to a suite and write them as JSONL (plus a ``.meta.json`` sidecar)."""
    parser = argparse.ArgumentParser(prog="lightning-unlearn lens-baseline", description=baseline_main.__doc__)
    parser.add_argument("--model", required=True, help="local model directory, or 'smollm2' (converted on first use)")
    parser.add_argument("--narrative", required=True)
    parser.add_argument("--language", required=True)
    parser.add_argument("--levels", nargs="+", default=None, help="levels to generate (default: all)")
    parser.add_argument("--condition", choices=CONDITIONS, default="compact")
    parser.add_argument("--max-new-tokens", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--chat-template", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (0: torch's default; 1 is fastest on a busy machine)"
    )
    parser.add_argument("--out", required=True, help="output JSONL")
    _labeler_args(parser, default=None)
    args = parser.parse_args(argv)

    # Validate everything a user can get wrong before loading a model or writing anything.
    records = load_suite(args.narrative, args.language, args.levels, args.condition)
    labeler = _labeler_from(args)
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}.")
    if args.threads:
        torch.set_num_threads(args.threads)
    from lightning_unlearn.models import load_causal_lm, load_tokenizer

    model_dir = _resolve_model_path(args.model)
    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir).to(args.device)
    chat = {"auto": None, "on": True, "off": False}[args.chat_template]
    start = time.perf_counter()
    rows = generate_for_records(model, tokenizer, records, args.max_new_tokens, args.batch_size, chat)
    seconds = time.perf_counter() - start
    meta = {
        "kind": "lens-baseline",
        "model": model_dir,
        "narrative": args.narrative,
        "language": args.language,
        "levels": sorted({r.level for r in records}, key=LEVELS.index),
        "condition": args.condition,
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "decoding": "greedy",
        "threads": torch.get_num_threads(),
        "n": len(rows),
        "generation_seconds": round(seconds, 3),
        "created": _now(),
    }
    if labeler is not None:
        rows = with_labels(rows, label_rows(rows, labeler), args.labeler)
        meta["labeler"] = args.labeler
        meta["summary"] = summarize_by_level(rows)
    out = Path(args.out)
    write_atomic({out: _jsonl(rows), meta_path(out): json.dumps(meta, indent=1, ensure_ascii=False)})
    print(f"wrote {len(rows)} answers to {out} in {seconds:.1f} s")
    if labeler is not None:
        print(format_level_summary(meta["summary"]))


def export_main(argv: list[str] | None = None) -> None:
    """Write the forget-eligible (L0) baseline answers as a CSV for annotators: fill the `label` column with
    Target-Dominant, Target-Included, Target-Rejected or Invalid."""
    parser = argparse.ArgumentParser(prog="lightning-unlearn lens-export", description=export_main.__doc__)
    parser.add_argument("--baseline", required=True, help="JSONL written by lens-baseline")
    parser.add_argument("--levels", nargs="+", default=list(FORGET_LEVELS))
    parser.add_argument("--out", required=True, help="output CSV")
    args = parser.parse_args(argv)
    rows = [r for r in read_jsonl(args.baseline) if r["level"] in args.levels]
    if not rows:
        raise ValueError(f"{args.baseline!r} has no answers at level(s) {', '.join(args.levels)}.")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=EXPORT_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({**r, "label": "", "notes": ""})
    write_atomic({Path(args.out): buf.getvalue()})
    print(
        f"wrote {len(rows)} rows to {args.out}; fill `label` with Target-Dominant / Target-Included / "
        "Target-Rejected / Invalid, then run lens-import."
    )


def import_main(argv: list[str] | None = None) -> None:
    """Build a forget set from baseline answers: strict (Target-Dominant rows of an annotated CSV) or weak (rows a
    labeler calls Reproduced; marked ``weak_labels: true`` in the metadata)."""
    parser = argparse.ArgumentParser(prog="lightning-unlearn lens-import", description=import_main.__doc__)
    parser.add_argument("--baseline", required=True, help="JSONL written by lens-baseline")
    parser.add_argument("--labels", default=None, help="annotated CSV/JSONL (manual labels) for the strict set")
    parser.add_argument("--levels", nargs="+", default=list(FORGET_LEVELS), help="eligible levels (default: L0)")
    parser.add_argument("--out", required=True, help="forget-set JSONL of {prompt, answer}")
    _labeler_args(parser, default=None)
    args = parser.parse_args(argv)
    if (args.labels is None) == (args.labeler is None):
        raise ValueError("give exactly one of --labels (manual, strict forget set) or --labeler (weak labels).")
    baseline = read_jsonl(args.baseline)
    rows = [r for r in baseline if r["level"] in args.levels]
    if not rows:
        raise ValueError(f"{args.baseline!r} has no answers at level(s) {', '.join(args.levels)}.")
    if args.labels is not None:
        manual = ManualLabels.read(args.labels)
        by_id = manual.by_id
        known = {r["id"] for r in rows}
        unknown = [i for i in manual.ids if i not in known]
        if unknown:
            raise ValueError(f"{args.labels!r} has ids not among the baseline's {args.levels} answers: {unknown[:5]}.")
        rows = [r for r in rows if r["id"] in by_id]
        keep = [by_id[r["id"]] == TARGET_DOMINANT for r in rows]
        counts = manual.counts()
        source, weak = "manual", False
    else:
        labels = label_rows(rows, _labeler_from(args))
        keep = [lbl.reproduced for lbl in labels]
        counts = dict(Counter(lbl.label for lbl in labels))
        source, weak = args.labeler, True
    forget = build_forget_rows(rows, keep)
    if not forget:
        raise ValueError(
            f"no forget rows: none of the {len(rows)} labeled answers is "
            f"{'Target-Dominant' if not weak else 'Reproduced'} (label counts {counts}); nothing was written."
        )
    base_meta_file = meta_path(args.baseline)
    base_meta = json.loads(base_meta_file.read_text(encoding="utf-8")) if base_meta_file.is_file() else {}
    meta = {
        "kind": "lens-forget-set",
        "narrative": sorted({r["narrative"] for r in rows}),
        "language": sorted({r["language"] for r in rows}),
        "condition": sorted({r["condition"] for r in rows}),
        "levels": list(args.levels),
        "labels": source,
        "weak_labels": weak,
        "rule": "Target-Dominant only" if not weak else f"{source} labeler: Reproduced",
        "n_candidates": len(rows),
        "n_forget": len(forget),
        "label_counts": counts,
        "baseline": str(args.baseline),
        "model": base_meta.get("model"),
        "created": _now(),
    }
    out = Path(args.out)
    write_atomic({out: _jsonl(forget), meta_path(out): json.dumps(meta, indent=1, ensure_ascii=False)})
    print(f"wrote {len(forget)} forget rows of {len(rows)} candidates to {out} (weak_labels={weak})")


def label_main(argv: list[str] | None = None) -> None:
    """Label a baseline file with a labeler, write the labeled JSONL and print Reproduced counts per level."""
    parser = argparse.ArgumentParser(prog="lightning-unlearn lens-label", description=label_main.__doc__)
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--out", required=True)
    _labeler_args(parser, default="signature")
    args = parser.parse_args(argv)
    labeler = _labeler_from(args)
    rows = read_jsonl(args.baseline)
    rows = with_labels(rows, label_rows(rows, labeler), args.labeler)
    write_atomic({Path(args.out): _jsonl(rows)})
    print(format_level_summary(summarize_by_level(rows)))


def calibrate_main(argv: list[str] | None = None) -> None:
    """Compare weak Reproduced labels with manual labels: precision/recall/F1, strict and broad, with Wilson and
    bootstrap 95% intervals (LENS Table 8)."""
    parser = argparse.ArgumentParser(prog="lightning-unlearn lens-calibrate", description=calibrate_main.__doc__)
    parser.add_argument("--labels", required=True, help="annotated CSV/JSONL (id, label; answer and the suite keys)")
    parser.add_argument("--predicted", default=None, help="labeled JSONL (id, label) from lens-label")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the report as JSON here")
    _labeler_args(parser, default=None)
    args = parser.parse_args(argv)
    manual = ManualLabels.read(args.labels)
    if args.predicted is not None:
        by_id = {r["id"]: r["label"] for r in read_jsonl(args.predicted)}
        missing = [i for i in manual.ids if i not in by_id]
        if missing:
            raise ValueError(f"{args.predicted!r} has no prediction for ids {missing[:5]}.")
        predicted = [by_id[i] == REPRODUCED for i in manual.ids]
        name = Path(args.predicted).name
    elif args.labeler is not None:
        rows = _read_rows(args.labels)
        predicted = [lbl.reproduced for lbl in label_rows(rows, _labeler_from(args))]
        name = args.labeler
    else:
        raise ValueError("give --predicted (a labeled JSONL) or --labeler to label the answers in --labels.")
    report = calibration_report(predicted, manual, n_bootstrap=args.bootstrap, seed=args.seed)
    if args.json:
        write_atomic({Path(args.json): json.dumps(report, indent=1)})
    print(format_calibration_table(report, title=f"Calibration of {name} against manual labels"))


def _read_rows(path: str) -> list[dict]:
    p = Path(path)
    if p.suffix == ".jsonl":
        return read_jsonl(p)
    with open(p, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    need = {"answer", "narrative", "language", "level"}
    if rows and not need <= set(rows[0]):
        raise ValueError(f"{path!r} needs columns {sorted(need)} to be labeled; use the CSV written by lens-export.")
    return rows
