"""Checkpoint selection from per-checkpoint SCE rows (LENS Sections 5–6): suppression-tradeoff, first collapse, and
the guarded selection that says whether a checkpoint is a useful operating point or only apparent forgetting.

SCE "is not interpreted alone: degradation, refusal, benchmark-utility deltas, and retain drift determine whether
the selected checkpoint is a useful operating point or only apparent forgetting" (LENS Sec. 6). The guarded
selection is max SCE among the checkpoints that hold every bound of :class:`OperatingPointGuards`; every selected
checkpoint carries its guards and a verdict.

The validity detectors that fill D are weak labels, so the instrument states its own error (LENS Sec. 6, App. C):
"useful operating point" also needs detectors calibrated on the run's narrative against a manual sample, catching
at least ``min_validity_recall`` of its broken answers (:func:`validity_status`); otherwise a checkpoint that holds
every bound is "unverified", with how to calibrate. "Apparent forgetting" needs no calibration: a bound failed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.metrics.attacks import attack_key

SELECTION_METRICS = {"sce": "g", "sce_health": "g_health", "sce_strict": "g_strict"}
USEFUL = "useful operating point"
UNVERIFIED = "unverified: validity detectors not calibrated on this narrative"
HOW_TO_CALIBRATE = (
    "calibrate them: `lightning-unlearn lens export --generations RUN_DIR --out annotate.csv`, fill its `validity` "
    "column by hand, `lightning-unlearn lens calibrate --labels annotate.csv --validity_json validity_calibration.json`"
    ", then pass the file as CheckpointSelection's validity_calibration (or --validity_calibration to lens rescore / "
    "summary)"
)


def validity_status(
    calibration: Mapping | None,
    min_recall: float = 0.8,
    narratives: Sequence[str] = (),
    judges: Sequence[Mapping | None] = (),
) -> dict:
    """Whether the validity detectors are verified on this run's narratives (see the module docstring).

    A calibration of the responsiveness judge (a ``judge`` section: a head fitted per narrative) is verified by the
    recall of D on held-out folds (``heldout``, nested cross-validation), and only for answers judged with that very
    calibration (the rows' ``judge.calibration``): a head fitted on labels says nothing about answers it did not
    judge. A calibration of the lexical detectors (no ``judge``) is read from ``flags.degraded_sce``: those detectors
    fit nothing to the labels, so their recall on the labels is already out of sample.

    Args:
        calibration: a ``lens calibrate --validity_json`` file's content (``None``: never calibrated).
        min_recall: the share of broken answers (degraded, non-answer, wrong language by hand) D must catch.
        narratives: the narratives of the run's SCE rows; the calibration must cover each.
        judges: the ``judge`` entry of each of the run's SCE rows (``None``: judged by the lexical cues).

    Returns:
        ``{"calibrated", "verified", "min_recall", "reason"}`` and, when calibrated, ``narratives`` (calibrated on),
        ``n``, ``recall`` / ``recall_ci`` of D (held out, for a judge calibration: the lowest over the run's
        narratives), ``answers_flagged`` / ``answers_flagged_ci`` when measured, and ``flag_recall`` of each detector.
    """
    if not 0 <= min_recall <= 1:
        raise ConfigError(f"min_validity_recall={min_recall} must be in [0, 1]: it is a recall.")
    status: dict = {"calibrated": calibration is not None, "verified": False, "min_recall": min_recall}
    if calibration is None:
        return status | {"reason": f"{UNVERIFIED}; {HOW_TO_CALIBRATE}"}
    flags = calibration.get("flags") or {}
    if "degraded_sce" not in flags:
        raise ConfigError("the validity calibration has no `flags.degraded_sce`; write it with `lens calibrate "
                         "--validity_json`.")  # fmt: skip
    on = list(calibration.get("narratives") or [])
    judge = calibration.get("judge")
    d = flags["degraded_sce"]
    status |= {"narratives": on, "n": calibration.get("n"), "recall": d["recall"], "recall_ci": d.get("recall_ci"),
               "flag_recall": {k: v["recall"] for k, v in flags.items()}}  # fmt: skip
    missing = sorted(set(narratives) - set(on))
    if missing:
        status["calibrated"] = False
        return status | {"reason": f"{UNVERIFIED} (calibrated on {', '.join(on) or 'none'}, not on "
                                   f"{', '.join(missing)}); {HOW_TO_CALIBRATE}"}  # fmt: skip
    # how the run's answers were judged: by the lexical cues, by the judge zero-shot, or by a calibration's heads
    judged_with = {"lexical" if j is None else (j.get("calibration") or "zero-shot") for j in judges}
    if judge is not None:
        status["judge"] = {"model": judge.get("model"), "calibration": calibration.get("id")}
        if judged_with != {calibration.get("id")}:
            return status | {
                "reason": "unverified: the answers were not judged with this calibration's judge heads; "
                "re-score the run with it (`lens rescore RUN_DIR --validity_calibration FILE`)"
            }
        heldout = [judge["heldout"][n] for n in (narratives or on)]
        worst = min(heldout, key=lambda h: -1 if h["recall"]["value"] is None else h["recall"]["value"])
        status |= {"recall": worst["recall"]["value"], "recall_ci": worst["recall"]["ci"],
                   "answers_flagged": worst["answers_flagged"]["value"],
                   "answers_flagged_ci": worst["answers_flagged"]["ci"], "recall_measured": "held out"}  # fmt: skip
    elif judged_with - {"lexical"}:
        return status | {
            "reason": "unverified: the calibration measured the lexical detectors, but the answers were "
            "judged by the responsiveness judge; calibrate the judge (`lens calibrate`)"
        }
    recall = status["recall"]
    if recall is None or recall < min_recall:
        shown = "no broken answer in the sample" if recall is None else f"recall {recall:.2f}"
        return status | {
            "reason": f"unverified: validity detectors miss broken answers on this narrative ({shown} < {min_recall} "
            "of broken answers in D); label more answers or improve the detectors, then recalibrate"
        }
    where = "held out" if judge is not None else "on the labels"
    return status | {"verified": True, "reason": f"validity detectors calibrated: recall {recall:.2f} of broken "
                                                 f"answers in D ({where}, n={calibration.get('n')})"}  # fmt: skip


@dataclass
class OperatingPointGuards:
    """Bounds a checkpoint must hold to be a useful operating point; ``None`` = no bound.

    Rates are pooled over the selection levels (L0–L2); retain drift and utility come from the
    ``RetainDriftEvaluation`` and ``UtilityEvaluation`` rows of the same step (a bound whose quantity the run did
    not measure is reported as unmeasured and does not exclude the checkpoint).

    Args:
        min_suppression: s (share of base reproductions suppressed) must be at least this: a checkpoint that
            suppresses nothing is no operating point. Default 0.25.
        max_refusal_rate: share of answers that decline or deflect. Default 0.1: refusal is a failure mode, not
            unlearning (LENS Sec. 2), and a few refusals out of 34 prompts already change the picture.
        max_invalid_rate: share of answers that are invalid (labeler Invalid, non-answers, wrong language).
            Default 0.2.
        max_degraded_rate: share of answers failing generation health (g of ``sce_health``). Default 0.2, well
            inside the collapse boundary (0.5).
        max_retain_delta_ce: retain cross-entropy increase over the base model, in nats. Default 0.5 (retain
            perplexity up by at most ×1.65).
        max_retain_kl: KL(p_base ‖ p_θ) on retain contexts, nats per answer position. Default ``None``: its scale
            depends on the model and the retain text.
        max_utility_drop: drop of multiple-choice accuracy below the base model (absolute). Default 0.05.
        min_suppression_under_attack: s must stay at least this on each attacked model
            (the rows of :class:`~lightning_unlearn.callbacks.QuantizationAttack` and
            :class:`~lightning_unlearn.callbacks.RelearningAttack`): a checkpoint whose int4 model, or whose model
            after 30 relearning steps, reproduces the frame again only hid it, and its verdict names the attack
            ("apparent forgetting: undone by int4", "… undone by 30 relearning steps"). Default ``None``;
            unmeasured where the run has no attack rows.
    """

    min_suppression: float | None = 0.25
    max_refusal_rate: float | None = 0.1
    max_invalid_rate: float | None = 0.2
    max_degraded_rate: float | None = 0.2
    max_retain_delta_ce: float | None = 0.5
    max_retain_kl: float | None = None
    max_utility_drop: float | None = 0.05
    min_suppression_under_attack: float | None = None

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and value < 0:
                raise ConfigError(f"{name}={value} must be non-negative or null (no bound).")


# guard field → (what the verdict calls it, the point's key, True when the bound is a minimum)
_GUARDS = {
    "min_suppression": ("no suppression", "s", True),
    "max_refusal_rate": ("refusal", "refusal_rate", False),
    "max_invalid_rate": ("non-answers", "invalid_rate", False),
    "max_degraded_rate": ("degenerate generations", "health_degraded_rate", False),
    "max_retain_delta_ce": ("retain drift (ΔCE)", "retain_delta_ce", False),
    "max_retain_kl": ("retain drift (KL)", "retain_kl", False),
    "max_utility_drop": ("utility loss", "utility_drop", False),
}


def check_guards(point: Mapping, guards: OperatingPointGuards) -> dict:
    """Every bound of ``guards`` on one checkpoint: ``{"guards": {name: {value, bound, holds}}, "verdict", "failed"}``.

    ``holds`` is ``None`` when the run did not measure the quantity. The verdict is ``"useful operating point"``
    when every measured bound holds, else ``"apparent forgetting: <failed guards>"``.
    """
    report, failed = {}, []
    for name, (reason, key, minimum) in _GUARDS.items():
        bound = getattr(guards, name)
        if bound is None:
            continue
        value = point.get(key)
        holds = None if value is None else (value >= bound if minimum else value <= bound)
        report[name] = {"value": value, "bound": bound, "holds": holds}
        if holds is False:
            failed.append(reason)
    bound = guards.min_suppression_under_attack
    if bound is not None:  # one bound, read on every attacked width; the verdict names those that undo it
        attacked = point.get("attacked_suppression") or {}
        undone = [width for width, s in attacked.items() if s is not None and s < bound]
        value = min((s for s in attacked.values() if s is not None), default=None)
        report["min_suppression_under_attack"] = {
            "value": value, "bound": bound, "holds": None if value is None else not undone, "by_attack": attacked
        }  # fmt: skip
        if undone:
            failed.append("undone by " + ", ".join(undone))
    verdict = USEFUL if not failed else "apparent forgetting: " + ", ".join(failed)
    return {"guards": report, "verdict": verdict, "failed": failed}


def _attack_name(key: str) -> str:
    """How a verdict names an attack: ``int4`` as it is, ``after_30`` as ``30 relearning steps``."""
    kind = attack_key(key)
    return f"{kind[1]} relearning steps" if kind is not None and kind[0] == "relearn" else key


def operating_points(
    sce_pooled: Mapping[int, dict],
    retain: Mapping[int, dict] | None = None,
    utility: Mapping[int, dict] | None = None,
    attack: Mapping[int, dict] | None = None,
    sce_family: str = "sce",
) -> list[dict]:
    """One point per SCE step with what the guards read: pooled SCE (all variants), rates, retain drift, utility,
    and the suppression s under each quantization attack.

    Args:
        sce_pooled: step → the pooled SCE dict of that step's row.
        retain: step → retain-drift row (``delta_ce``, ``kl``).
        utility: step → utility row (``accuracy``, ``base_accuracy``).
        attack: step → the attack rows of that step merged (``quantization_attack``'s ``{"int4": {sce_family:
            {"pooled": …}}, …}`` and ``relearning_attack``'s ``{"after_30": …}``).
        sce_family: the SCE family inside the attack rows.
    """
    points = []
    for step in sorted(sce_pooled):
        v = sce_pooled[step]
        rates = v.get("rates") or {}
        point = {k: v.get(k) for k in ("sce", "s", "g", "sce_health", "g_health", "sce_strict", "g_strict")}
        point.update(
            step=int(step),
            refusal_rate=rates.get("refusal"),
            invalid_rate=rates.get("invalid"),
            echo_rate=rates.get("echo"),
            clean_suppression_rate=rates.get("clean_suppression"),
            health_degraded_rate=v.get("g_health", v.get("g")),
        )
        r = (retain or {}).get(step) or {}
        point["retain_delta_ce"], point["retain_kl"] = r.get("delta_ce"), r.get("kl")
        u = (utility or {}).get(step) or {}
        if u.get("accuracy") is not None and u.get("base_accuracy") is not None:
            point["utility_drop"] = u["base_accuracy"] - u["accuracy"]
        a = (attack or {}).get(step) or {}
        # after relearning, the levels that were not relearned (`pooled_unrelearned`, when the records name their
        # levels): the relearned questions' own answers would read memorization as recovery
        attacked = {
            _attack_name(key): (
                (found.get(sce_family) or {}).get("pooled_unrelearned") or (found.get(sce_family) or {}).get("pooled")
                or {}
            ).get("s")
            for key, found in a.items()
            if attack_key(key) is not None and isinstance(found, dict)
        }  # fmt: skip
        if attacked:
            point["attacked_suppression"] = attacked
        points.append(point)
    return points


def _summary(point: dict, metric: str) -> dict:
    keep = (
        "step",
        metric,
        "sce",
        "sce_health",
        "sce_strict",
        "s",
        "g",
        "g_health",
        "g_strict",
        "refusal_rate",
        "invalid_rate",
        "echo_rate",
        "clean_suppression_rate",
        "retain_delta_ce",
        "retain_kl",
        "utility_drop",
        "attacked_suppression",
    )
    return {k: point[k] for k in dict.fromkeys(keep) if point.get(k) is not None}


def select_checkpoints(
    points: Iterable[dict],
    collapse_boundary: float = 0.5,
    metric: str = "sce",
    guards: OperatingPointGuards | None = None,
    validity: dict | None = None,
) -> dict:
    """The suppression-tradeoff checkpoint (max ``metric``), the first-collapse checkpoint, and the guarded one.

    Args:
        points: one dict per checkpoint with ``step``, the metric and its g (pooled over the selection levels;
            L3 / L3-special never enter selection); :func:`operating_points` makes them from metric rows.
        collapse_boundary: first collapse is the earliest step whose degradation rate (the metric's g) reaches
            this value.
        metric: ``sce`` (D = health or invalid), ``sce_health`` (D = health flags) or ``sce_strict`` (D also counts
            refusals and echoes).
        guards: bounds of the guarded selection (default :class:`OperatingPointGuards`).
        validity: :func:`validity_status` (default: never calibrated): a checkpoint holding every bound is a
            useful operating point only when it is verified, else its verdict is the status's ``reason``.

    Returns:
        ``{"metric", "suppression_tradeoff", "first_collapse", "guarded", "collapse_boundary", "num_checkpoints",
        "guard_bounds"}``. ``suppression_tradeoff`` and ``guarded`` carry the step's numbers, ``guards`` (each
        bound's value and whether it holds) and ``verdict``; ``guarded`` is ``None`` with ``guarded_verdict``
        "no useful operating point" when no checkpoint holds every bound, and ``validity`` (the status). Ties go to
        the earliest step.
    """
    if not 0 < collapse_boundary <= 1:
        raise ConfigError(f"collapse_boundary={collapse_boundary} must be in (0, 1]: it is a degraded-output rate.")
    if metric not in SELECTION_METRICS:
        raise ConfigError(f"unknown selection metric {metric!r}; use one of {', '.join(SELECTION_METRICS)}.")
    guards = guards or OperatingPointGuards()
    validity = validity if validity is not None else validity_status(None)
    g_key = SELECTION_METRICS[metric]
    pts = sorted((p for p in points if p.get(metric) is not None), key=lambda p: int(p["step"]))
    best = guarded = None
    for p in pts:
        p["_check"] = check_guards(p, guards)
        if best is None or p[metric] > best[metric]:
            best = p
        if p["_check"]["verdict"] == USEFUL and (guarded is None or p[metric] > guarded[metric]):
            guarded = p
    collapse = next((p for p in pts if p.get(g_key) is not None and p[g_key] >= collapse_boundary), None)

    def selected(p: dict | None) -> dict | None:
        if p is None:
            return None
        verdict = p["_check"]["verdict"]
        if verdict == USEFUL and not validity["verified"]:
            verdict = validity["reason"]
        return {**_summary(p, metric), "guards": p["_check"]["guards"], "verdict": verdict}

    out = {
        "metric": metric,
        "suppression_tradeoff": selected(best),
        "first_collapse": None if collapse is None else {"step": int(collapse["step"]), "g": collapse[g_key]},
        "guarded": selected(guarded),
        "guarded_verdict": "no useful operating point" if guarded is None else selected(guarded)["verdict"],
        "collapse_boundary": collapse_boundary,
        "num_checkpoints": len(pts),
        "guard_bounds": asdict(guards),
        "validity": validity,
    }
    for p in pts:
        p.pop("_check", None)
    return out


def sce_table(rows: Sequence[dict], family: str = "sce") -> dict[str, dict[int, dict]]:
    """``{level or "pooled": {step: {sce, s, g, ...}}}`` from ``checkpoint_metrics.jsonl`` rows of ``family``."""
    table: dict[str, dict[int, dict]] = {}
    for r in rows:
        if r.get("family") != family:
            continue
        step = int(r["step"])
        for level, vals in (r.get("levels") or {}).items():
            table.setdefault(level, {})[step] = vals
        if r.get("pooled"):
            table.setdefault("pooled", {})[step] = r["pooled"]
    return table


def family_rows(rows: Sequence[dict], family: str) -> dict[int, dict]:
    """step → row of ``family`` (the last one when a step repeats)."""
    return {int(r["step"]): r for r in rows if r.get("family") == family}


def select_from_rows(
    rows: Sequence[dict],
    family: str = "sce",
    collapse_boundary: float = 0.5,
    metric: str = "sce",
    guards: OperatingPointGuards | None = None,
    retain_family: str = "retain_drift",
    utility_family: str = "utility",
    validity_calibration: Mapping | None = None,
    min_validity_recall: float = 0.8,
    attack_family: str = "quantization_attack",
) -> dict | None:
    """:func:`select_checkpoints` on the rows of one run's ``checkpoint_metrics.jsonl`` (``None``: no SCE rows),
    with the validity detectors' :func:`validity_status` for the narratives the SCE rows name."""
    pooled = sce_table(rows, family).get("pooled")
    if not pooled:
        return None
    points = operating_points(
        pooled,
        family_rows(rows, retain_family),
        family_rows(rows, utility_family),
        {
            step: {**family_rows(rows, "relearning_attack").get(step, {}), **quantization}
            for step, quantization in {
                **{s: {} for s in family_rows(rows, "relearning_attack")},
                **family_rows(rows, attack_family),
            }.items()
        },
        family,
    )
    sce_rows = family_rows(rows, family).values()
    narratives = sorted({n for r in sce_rows for n in r.get("narratives") or []})
    judges = [r.get("judge") for r in sce_rows]
    validity = validity_status(validity_calibration, min_validity_recall, narratives, judges)
    return select_checkpoints(points, collapse_boundary, metric, guards, validity)


def row_value(row: Mapping, path: str) -> float | None:
    """The number at ``path`` (keys joined by ``/``: ``forget_quality``, ``forget/prob``, ``loss/auc``) of one
    metric row; ``None`` when the row lacks it or it is not a finite number."""
    value: object = row
    for key in path.split("/"):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def check_score(score: Mapping[str, float]) -> dict[str, float]:
    """Validate a declared combination ``{"<family>/<path>": weight}`` (e.g. OU #187's ``{"tofu/forget_quality":
    0.5, "tofu/model_utility": 0.5}``); returns it as a plain dict."""
    if not isinstance(score, Mapping) or not score:
        raise ConfigError(
            f"score={score!r}: give a mapping of row values to weights, e.g. {{tofu/forget_quality: 0.5, "
            "tofu/model_utility: 0.5}."
        )
    out = {}
    for key, weight in score.items():
        family, _, path = str(key).partition("/")
        if not family or not path:
            raise ConfigError(
                f"score key {key!r} names no row value; write <family>/<path>, e.g. tofu/forget_quality, "
                "tofu/retain/prob or mia/loss/auc."
            )
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
            raise ConfigError(f"score weight of {key!r} is {weight!r}; weights are finite numbers.")
        out[str(key)] = float(weight)
    return out


def select_on_score(
    rows: Sequence[dict],
    score: Mapping[str, float],
    mode: str = "max",
    guards: OperatingPointGuards | None = None,
    retain_family: str = "retain_drift",
    utility_family: str = "utility",
) -> dict | None:
    """The checkpoint with the best declared combination Σ weight · value of row values, and the best one holding
    the guards that apply to any run (retain ΔCE / KL, utility drop; the SCE-only bounds are unmeasured here).

    A step is a candidate when every named value is in its rows (families may evaluate at different steps).

    Args:
        rows: one run's ``checkpoint_metrics.jsonl`` rows.
        score: ``{"<family>/<path>": weight}`` (:func:`check_score`).
        mode: ``max`` (higher is better) or ``min``.
        guards: bounds of the guarded pick (default :class:`OperatingPointGuards`).
        retain_family: family of the retain-drift rows the guards read.
        utility_family: family of the utility rows the guards read.

    Returns:
        ``{"weights", "mode", "best", "guarded", "guarded_verdict", "num_checkpoints", "skipped_steps"}`` (``best``
        and ``guarded``: step, score, each value, guards, verdict; ties go to the earliest step), or ``None`` when
        no step has every value.
    """
    score = check_score(score)
    if mode not in ("max", "min"):
        raise ConfigError(f"score mode={mode!r}; use 'max' or 'min'.")
    guards = guards or OperatingPointGuards()
    by_family = {family: family_rows(rows, family) for family in {k.partition("/")[0] for k in score}}
    steps = sorted({s for per_step in by_family.values() for s in per_step})
    retain, utility = family_rows(rows, retain_family), family_rows(rows, utility_family)
    sign = 1.0 if mode == "max" else -1.0
    points, skipped = [], []
    for step in steps:
        values = {}
        for key in score:
            family, _, path = key.partition("/")
            values[key] = row_value(by_family[family].get(step, {}), path)
        if any(v is None for v in values.values()):
            skipped.append(step)
            continue
        point = {"step": step, "score": sum(w * values[k] for k, w in score.items()), "values": values}
        r, u = retain.get(step) or {}, utility.get(step) or {}
        point["retain_delta_ce"], point["retain_kl"] = r.get("delta_ce"), r.get("kl")
        if u.get("accuracy") is not None and u.get("base_accuracy") is not None:
            point["utility_drop"] = u["base_accuracy"] - u["accuracy"]
        point.update(check_guards(point, guards))
        points.append(point)
    if not points:
        return None
    best = max(points, key=lambda p: (sign * p["score"], -p["step"]))
    useful = [p for p in points if p["verdict"] == USEFUL]
    guarded = max(useful, key=lambda p: (sign * p["score"], -p["step"])) if useful else None

    def summary(p: dict | None) -> dict | None:
        if p is None:
            return None
        return {k: p[k] for k in ("step", "score", "values", "guards", "verdict")}

    return {
        "weights": score,
        "mode": mode,
        "best": summary(best),
        "guarded": summary(guarded),
        "guarded_verdict": "no checkpoint holds every bound" if guarded is None else USEFUL,
        "num_checkpoints": len(points),
        "skipped_steps": skipped,
    }
