"""The answer-validity decision against real SmolLM2 answers labeled by hand: the lexical detectors, and the
responsiveness judge calibrated from 20, 40 and 80 labels that ``lens export`` chooses.

The fixtures (``tests/fixtures/lens_smollm2_labeled*.jsonl``) hold post-unlearning answers of SmolLM2-135M-Instruct
from LENS trajectories (NPO and TOFU-GA), each classed by hand as degraded / refusal / echo / non_answer / fine.
Every answer goes through the SCE callback's own path (degeneration report, signature labeler, answer validity,
and the judge when one is given). Prints JSON.

    python benchmarks/answer_validity.py [FIXTURE.jsonl ...] [--sizes 20 40 80] [--seeds 10] [--near-share 0.5]

Per fixture:

- ``health_flags``: each generation-health flag's precision and recall against the hand class *degraded*.
- ``lexical``: the regular-expression detectors (the topic and claim cues of the suite, no judge): share of broken
  answers (degraded or non-answer by hand) in D and of real answers flagged. In-sample for NATO (the cues were
  written with its answers); out of sample for the others.
- ``judge.zero_shot_auc``: ROC AUC of the judge's uncalibrated score (mean of cos(answer, question) and the largest
  cos(answer, hypothesis)), real answers against broken ones that pass the health flags; ``judge.head_auc``: the
  same for the calibrated head's out-of-fold log-odds when every answer is labeled (5-fold), and
  ``head_auc_with_base_nll`` with the answer's NLL per token under the base model (the fixtures' ``base_nll``) as one
  more input of the head (what the retired ``max_base_nll`` bound judged).
- ``judge.calibrated[n]``: the protocol a user follows, simulated with the hand classes as the annotator, ``seeds``
  times: ``lens export`` picks ``n`` answers of the fixture (``near_share`` of them near the zero-shot threshold,
  the rest at random, weighted 1/π); ``lens calibrate`` fits the head and reports D's recall and the share of real
  answers flagged on held-out folds (``cv``, what the tool states); the head then decides every answer of the
  fixture (``pool``) and those nobody labeled (``unlabeled``), the truth the ``cv`` estimate should track. Mean,
  min and max over seeds; the first seed's ``cv`` Wilson intervals.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from lightning_unlearn.labelers import SignatureLabeler
from lightning_unlearn.labelers.calibration import wilson_interval
from lightning_unlearn.labelers.judge_calibration import fit_head
from lightning_unlearn.labelers.responsiveness_judge import DEFAULT_JUDGE_MODEL, JudgeHead, ResponsivenessJudge
from lightning_unlearn.metrics.answer_validity import OUTCOME_ORDER, primary_outcome
from lightning_unlearn.metrics.degeneration import degeneration_report
from lightning_unlearn.workflows.lens.validity import calibrate_judge, detect_validity, picks_by_judge, scorer

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
BROKEN = ("degraded", "non_answer")  # what SCE's D must hold: broken answers and non-answers
CLASS = {"fine": "answer"}  # the fixtures' hand class → the validity class of `lens calibrate`


def read_fixture(path: Path) -> list[dict]:
    """A fixture's rows in the shape ``lens export`` writes (narrative, language, run and step from the row)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        narrative, language = r["id"].split("/")[:2]
        run, _, step = r["source"].rpartition("/step=")
        rows.append({**r, "narrative": narrative, "language": language, "run": run, "step": int(step or 0)})
    return rows


def outcome(row: dict) -> str:
    """One category per scored answer, as the hand classes are: degraded / refusal / echo / non_answer / fine."""
    validity = {k: row[k] for k in ("refusal", "echo", "non_answer", "wrong_language")}
    return primary_outcome(row["degraded"], validity, row["label"] == "Invalid")


def rates(gold: list[str], detected: list[dict]) -> dict:
    """Share of broken answers in D and of real answers flagged as anything, with counts."""
    broken = [d["degraded_sce"] for g, d in zip(gold, detected) if g in BROKEN]
    real = [outcome(d) != "fine" for g, d in zip(gold, detected) if g == "fine"]
    return {
        "broken_in_d": round(sum(broken) / max(len(broken), 1), 3),
        "broken": len(broken),
        "fine_flagged": round(sum(real) / max(len(real), 1), 3),
        "fine": len(real),
    }


def scores(rows: list[dict], judge: ResponsivenessJudge | None = None) -> dict:
    """Per-class precision, recall and support of the detectors' category against the hand class, the confusion
    matrix (rows = manual, columns = detected), the share of broken answers in D (``broken_in_d``) and of real
    answers flagged as anything (``fine_flagged``)."""
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

    detected = detect_validity(rows, SignatureLabeler(), None, judge)
    gold, pred = [r["label"] for r in rows], [outcome(d) for d in detected]
    p, r, _, n = precision_recall_fscore_support(gold, pred, labels=list(OUTCOME_ORDER), zero_division=0)
    return {
        "answers": len(rows),
        "per_class": {
            c: {"precision": round(float(pi), 3), "recall": round(float(ri), 3), "support": int(ni)}
            for c, pi, ri, ni in zip(OUTCOME_ORDER, p, r, n)
        },  # fmt: skip
        "accuracy": round(sum(g == q for g, q in zip(gold, pred)) / len(rows), 3),
        **rates(gold, detected),
        "confusion": {
            "labels": list(OUTCOME_ORDER),
            "matrix": confusion_matrix(gold, pred, labels=list(OUTCOME_ORDER)).tolist(),
        },  # fmt: skip
    }


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


def judge_auc(rows: list[dict], judge: ResponsivenessJudge) -> dict:
    """ROC AUC of real against broken answers that pass the health flags: the zero-shot score, and the head's
    5-fold out-of-fold log-odds with every answer labeled."""
    from sklearn.model_selection import StratifiedKFold

    labeler = SignatureLabeler()
    plain = detect_validity(rows, labeler)
    keep = [i for i, r in enumerate(rows) if r["label"] in ("fine", *BROKEN) and not plain[i]["degraded"]]
    sce = scorer([rows[i] for i in keep], labeler)
    x = judge.inputs([rows[i]["answer"] for i in keep], [sce.question_of(r) for r in sce.records],
                     [sce.hypotheses_of(r) for r in sce.records])  # fmt: skip
    y = np.array([rows[i]["label"] == "fine" for i in keep])

    def head_auc(inputs: np.ndarray) -> float:
        oof = np.zeros(len(y))
        for train, test in StratifiedKFold(5, shuffle=True, random_state=0).split(inputs, y):
            oof[test] = fit_head(inputs[train], y[train], np.ones(len(train))).decision_function(inputs[test])
        return round(float(roc_auc_score(y, oof)), 3)

    out = {"zero_shot_auc": round(float(roc_auc_score(y, x[:, -2:].mean(1))), 3), "head_auc": head_auc(x),
           "answers": len(keep)}  # fmt: skip
    if all(rows[i].get("base_nll") is not None for i in keep):  # the retired max_base_nll, as one more input
        nll = np.array([[rows[i]["base_nll"] / 3] for i in keep])
        out["head_auc_with_base_nll"] = head_auc(np.concatenate([x, nll], axis=1))
    return out


def calibrated(rows: list[dict], judge: ResponsivenessJudge, n: int, seeds: int, near_share: float) -> dict:
    """The export → label → calibrate protocol at ``n`` labels over ``seeds`` draws (see the module docstring)."""
    labeler = SignatureLabeler()
    gold = [r["label"] for r in rows]
    runs = []
    for seed in range(seeds):
        picks = picks_by_judge(rows, n, judge, labeler, None, near_share, seed)
        labeled = [{**rows[p.index], "weight": p.weight} for p in picks]
        classes = [CLASS.get(r["label"], r["label"]) for r in labeled]
        try:
            section, _ = calibrate_judge(labeled, classes, labeler, judge, None, 0.1, seed)
        except ValueError as err:  # too few labels of a class in this draw
            runs.append({"error": str(err)})
            continue
        cv = next(iter(section["heldout"].values()))
        heads = {k: JudgeHead.from_dict(v) for k, v in section["heads"].items()}
        decided = detect_validity(rows, labeler, None, judge.with_heads(heads))
        rest = sorted(set(range(len(rows))) - {p.index for p in picks})
        runs.append({"cv": cv, "pool": rates(gold, decided),
                     "unlabeled": rates([gold[i] for i in rest], [decided[i] for i in rest])})  # fmt: skip
    ok = [r for r in runs if "error" not in r]

    def summary(values: list[float]) -> dict:
        return {"mean": round(float(np.mean(values)), 3), "min": round(float(np.min(values)), 3),
                "max": round(float(np.max(values)), 3)} if values else {}  # fmt: skip

    return {
        "labels": min(n, len(rows)),
        "draws": seeds,
        "failed_draws": len(runs) - len(ok),
        "cv_recall": summary([r["cv"]["recall"]["value"] for r in ok if r["cv"]["recall"]["value"] is not None]),
        "cv_answers_flagged": summary([r["cv"]["answers_flagged"]["value"] for r in ok]),
        "cv_first_draw": ok[0]["cv"] if ok else None,
        "pool_recall": summary([r["pool"]["broken_in_d"] for r in ok]),
        "pool_answers_flagged": summary([r["pool"]["fine_flagged"] for r in ok]),
        "unlabeled_recall": summary([r["unlabeled"]["broken_in_d"] for r in ok if r["unlabeled"]["broken"]]),
        "unlabeled_answers_flagged": summary([r["unlabeled"]["fine_flagged"] for r in ok if r["unlabeled"]["fine"]]),
    }


def main(paths: list[str], sizes: list[int], seeds: int, near_share: float, model: str) -> None:
    files = [Path(p) for p in paths] or sorted(FIXTURES.glob("lens_smollm2_labeled*.jsonl"))
    judge = ResponsivenessJudge(model)
    result = {"judge_model": model, "near_share": near_share, "fixtures": {}}
    for path in files:
        rows = read_fixture(path)
        gold = [r["label"] for r in rows]
        entry = {"answers": len(rows), "lexical": rates(gold, detect_validity(rows, SignatureLabeler()))}
        entry["health_flags"] = health_flags(rows)
        entry["judge"] = judge_auc(rows, judge)
        entry["judge"]["calibrated"] = {str(n): calibrated(rows, judge, n, seeds, near_share) for n in sizes}
        result["fixtures"][path.name] = entry
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixtures", nargs="*")
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 40, 80])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--near-share", type=float, default=0.5)
    parser.add_argument("--model", default=DEFAULT_JUDGE_MODEL)
    args = parser.parse_args()
    main(args.fixtures, args.sizes, args.seeds, args.near_share, args.model)
