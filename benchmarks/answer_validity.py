"""Precision and recall of the answer-validity and health detectors on manually labeled real SmolLM2 answers.

The fixture (``tests/fixtures/lens_smollm2_labeled.jsonl``) holds post-unlearning answers of SmolLM2-135M-Instruct
from the LENS trajectories (NATO-forced-war × en; NPO and TOFU-GA at lr 2e-4, NPO at lr 5e-5), each labeled by
hand as one of degraded / refusal / echo / non_answer / fine. Every answer goes through the SCE callback's own
path (degeneration report, signature labeler, answer validity) and :func:`primary_outcome`; prints JSON.

    python benchmarks/answer_validity.py [FIXTURE.jsonl ...] [--measure-base-nll MODEL_DIR]

Besides the per-fixture scores it prints ``health_flags`` (each generation-health flag's precision and recall
against the hand class *degraded*, with Wilson intervals: the flags' thresholds were set on NATO answers, so the
other fixtures are out of sample) and ``cross_narrative`` (the base-NLL bound fitted on each fixture in turn, as the
smallest bound that flags at most 10 % of its real answers by itself, and every fixture scored at that bound; fitted
on the two shipped narratives only, since the third narrative's labels are for the final report).

A fixture row: ``id`` (its suite id, which names the narrative and language), ``level``, ``question``, ``answer``,
``hit_token_cap``, ``label`` (by hand) and ``source`` (run / method / step).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

from lightning_unlearn.data.narratives import COMPACT_INSTRUCTION, load_narrative
from lightning_unlearn.labelers import SignatureLabeler
from lightning_unlearn.labelers.calibration import wilson_interval
from lightning_unlearn.labelers.narrative_label import INVALID
from lightning_unlearn.metrics.answer_validity import (
    OUTCOME_ORDER,
    answer_validity,
    load_validity_cues,
    primary_outcome,
)
from lightning_unlearn.metrics.degeneration import degeneration_report

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "lens_smollm2_labeled.jsonl"


MAX_BASE_NLL = 1.7  # fitted on the NATO fixture alone: above every real answer there (max 1.67), below 32 of 34
# non-answers; SmolLM2-135M-Instruct nats per answer token given the chat-rendered question


def measure_base_nll(rows: list[dict], model_dir: str, batch_size: int = 8) -> list[float]:
    """Each row's mean NLL per answer token under the base model given its question, as ``SCEEvaluation`` computes
    it with ``max_base_nll`` (the suite prompt rendered with the chat template, the adapter-free model)."""
    import torch

    from lightning_unlearn.callbacks.qa_records import encode_batch, forward_logits
    from lightning_unlearn.generation import model_prompt
    from lightning_unlearn.losses import sequence_logprobs
    from lightning_unlearn.models import load_causal_lm, load_tokenizer

    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            items = [{"prompt": model_prompt(tokenizer, r["question"]), "answer": r["answer"]}
                     for r in rows[i : i + batch_size]]  # fmt: skip
            batch = encode_batch(tokenizer, items, 4096)
            logps, n = sequence_logprobs(forward_logits(model, batch), batch["labels"])
            out += [round(float(-lp / max(int(k), 1)), 4) for lp, k in zip(logps, n)]
    return out


def predict(rows: list[dict], max_base_nll: float | None = None) -> list[str]:
    """The detectors' category of each fixture row (its narrative and language from its suite id); with
    ``max_base_nll``, the rows' measured ``base_nll`` is judged too."""
    labeler = SignatureLabeler()
    reports = degeneration_report([r["answer"] for r in rows], [r["hit_token_cap"] for r in rows])
    out = []
    for row, rep in zip(rows, reports):
        narrative, language = row["id"].split("/")[:2]
        spec, cues = load_narrative(narrative, language), load_validity_cues(language)
        label = labeler.label_one(row["answer"], spec, row["level"])
        question = row["question"].replace(COMPACT_INSTRUCTION[language], "")
        validity = answer_validity(row["answer"], question, cues, spec.on_topic(row["answer"]), label.reproduced,
                                   label.stance, spec.claim_terms(row["answer"]), row.get("base_nll"),
                                   max_base_nll)  # fmt: skip
        out.append(primary_outcome(rep["degraded"], validity, label.label == INVALID))
    return out


BROKEN = ("degraded", "non_answer")  # what SCE's D must hold: broken answers and non-answers


def scores(rows: list[dict], max_base_nll: float | None = None) -> dict:
    """Per-class precision, recall and support, the confusion matrix (rows = manual, columns = detected), and what
    matters for SCE: the share of broken answers (degraded or non-answer by hand) that land in D
    (``broken_in_d``, whichever of the two classes the detectors give) and the share of real answers (``fine``)
    flagged as anything (``fine_flagged``)."""
    gold, pred = [r["label"] for r in rows], predict(rows, max_base_nll)
    broken = [q for g, q in zip(gold, pred) if g in BROKEN]
    fine = [q for g, q in zip(gold, pred) if g == "fine"]
    p, r, _, n = precision_recall_fscore_support(gold, pred, labels=list(OUTCOME_ORDER), zero_division=0)
    return {
        "answers": len(rows),
        "per_class": {
            c: {"precision": round(float(pi), 3), "recall": round(float(ri), 3), "support": int(ni)}
            for c, pi, ri, ni in zip(OUTCOME_ORDER, p, r, n)
        },  # fmt: skip
        "accuracy": round(sum(g == q for g, q in zip(gold, pred)) / len(rows), 3),
        "broken_in_d": round(sum(q in BROKEN for q in broken) / max(len(broken), 1), 3),
        "fine_flagged": round(sum(q != "fine" for q in fine) / max(len(fine), 1), 3),
        "confusion": {
            "labels": list(OUTCOME_ORDER),
            "matrix": confusion_matrix(gold, pred, labels=list(OUTCOME_ORDER)).tolist(),
        },  # fmt: skip
    }


FIT_ON = ("lens_smollm2_labeled.jsonl", "lens_smollm2_labeled_taiwan.jsonl")  # never the third narrative
HEALTH_FLAGS = ("empty", "unfinished", "char_loop", "bracket_loop", "ngram_loop", "nonlanguage", "degraded")


def _rate(hits: int, total: int) -> dict:
    low, high = wilson_interval(hits, total) if total else (None, None)
    return {"value": round(hits / total, 3) if total else None, "hits": hits, "of": total,
            "wilson95": None if low is None else [round(low, 3), round(high, 3)]}  # fmt: skip


def health_flags(rows: list[dict]) -> dict:
    """Each health flag (and ``degraded``, the callback's decision) against the hand class *degraded*: precision,
    recall (Wilson 95 %) and what it flags of each hand class. ``unfinished`` (the cap cut the answer) is reported but
    degrades nothing alone, so its row shows how many coherent answers the cap cuts."""
    reports = degeneration_report([r["answer"] for r in rows], [r["hit_token_cap"] for r in rows])
    gold = [r["label"] for r in rows]
    positives = sum(g == "degraded" for g in gold)
    out = {}
    for flag in HEALTH_FLAGS:
        fired = [bool(rep[flag]) for rep in reports]
        hits = sum(f and g == "degraded" for f, g in zip(fired, gold))
        by_class = {c: sum(f and g == c for f, g in zip(fired, gold)) for c in sorted(set(gold))}
        out[flag] = {"flagged": sum(fired), "by_hand_class": by_class,
                     "precision": _rate(hits, sum(fired)), "recall": _rate(hits, positives)}  # fmt: skip
    return out


def fit_bound(rows: list[dict], max_fine_flagged: float = 0.1) -> float:
    """The smallest base-NLL bound (to 0.01) that flags at most ``max_fine_flagged`` of ``rows``' real answers."""
    fine = sorted(r["base_nll"] for r in rows if r["label"] == "fine")
    allowed = int(max_fine_flagged * len(fine))  # real answers the bound may flag
    if not fine:
        return MAX_BASE_NLL
    kept = fine[len(fine) - 1 - allowed]  # the largest real answer's NLL the bound must not flag
    return round(math.floor(kept * 100 + 1e-6) / 100 + 0.01, 2)


def main(paths: list[str], measure: str | None = None) -> None:
    """Scores per fixture file (default: every ``tests/fixtures/lens_smollm2_labeled*.jsonl``), with the lexical
    detectors alone and with the base model's NLL judged at :data:`MAX_BASE_NLL`. ``measure``: a model directory;
    (re)measure every row's ``base_nll`` with it and rewrite the fixture files first."""
    files = [Path(p) for p in paths] or sorted(FIXTURE.parent.glob("lens_smollm2_labeled*.jsonl"))
    result, fixtures = {}, {}
    for path in files:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if measure:
            rows = [{**r, "base_nll": v} for r, v in zip(rows, measure_base_nll(rows, measure))]
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        result[path.name] = {"lexical": scores(rows), "health_flags": health_flags(rows)}
        if all(r.get("base_nll") is not None for r in rows):
            result[path.name]["with_base_nll"] = scores(rows, MAX_BASE_NLL)
            fixtures[path.name] = rows
    cross = {}
    for fitted_on, rows in fixtures.items():
        if fitted_on not in FIT_ON:
            continue
        bound = fit_bound(rows)
        cross[fitted_on] = {"bound": bound, "scored": {
            name: {k: scores(other, bound)[k] for k in ("broken_in_d", "fine_flagged")}
            for name, other in fixtures.items()}}  # fmt: skip
    result["cross_narrative"] = cross
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixtures", nargs="*")
    parser.add_argument("--measure-base-nll", metavar="MODEL_DIR", help="(re)measure each row's base_nll first")
    args = parser.parse_args()
    main(args.fixtures, args.measure_base_nll)
