"""Suppression-tradeoff and first-collapse checkpoints, ``selection.json`` and the SCE heatmap, as training runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_unlearn.callbacks.checkpoint_metrics_file import METRICS_FILE, read_rows, run_output_dir
from lightning_unlearn.callbacks.logger_media import hparams_values, log_figure, log_hparams, log_table
from lightning_unlearn.callbacks.sce_heatmap import save_figure, sce_heatmap_figure, write_json
from lightning_unlearn.callbacks.stop_listener import StopListener
from lightning_unlearn.distributed import world
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.labelers.calibration import load_validity_calibration
from lightning_unlearn.metrics.selection import (
    SELECTION_METRICS,
    USEFUL,
    OperatingPointGuards,
    check_score,
    sce_table,
    select_from_rows,
    select_on_score,
)

SELECTION_FILE = "selection.json"
HEATMAP_FILE = "sce_heatmap.png"
# The selected checkpoint's numbers in the HParams session, under ``<family>/selected/``.
SESSION_VALUES = ("step", "sce", "sce_health", "sce_strict", "s", "g", "g_health", "g_strict", "retain_delta_ce")


class CheckpointSelection(Callback, StopListener):
    """Select checkpoints from the SCE rows after every evaluated checkpoint (rank 0 only; no collectives).

    Writes ``<output_dir>/selection.json`` and ``<output_dir>/sce_heatmap.png`` (panels L0, L1, L2, pooled;
    columns = steps), and logs the heatmap to TensorBoard as an image. ``selection.json`` holds
    (:func:`~lightning_unlearn.metrics.selection.select_checkpoints`):

    - the suppression-tradeoff checkpoint = max pooled L0–L2 ``metric``;
    - the first-collapse checkpoint = earliest step whose pooled degraded rate (the metric's g) reaches
      ``collapse_boundary``;
    - the guarded checkpoint = max ``metric`` among the steps that hold every bound of ``guards`` (refusal and
      invalid rates, generation health, retain ΔCE / KL from ``RetainDriftEvaluation``, utility drop from
      ``UtilityEvaluation``), or none;
    - for each selected checkpoint, every bound's value and whether it holds, and the verdict "useful operating
      point" or "apparent forgetting: <reasons>" (LENS Sec. 6: SCE is never read alone);
    - ``validity``: whether the answer-validity detectors were calibrated on this narrative, with their recall; a
      checkpoint holding every bound is "unverified: …" until they are (with how to calibrate them).

    - ``stopped`` (when the :class:`~lightning_unlearn.callbacks.StopRule` ended the run): the first discarded step
      and the reason; the checkpoints from that step on are gone and never selected.

    At the end of ``fit`` and of ``validate`` the selection is also one HParams session (TensorBoard's HParams view
    compares it with other runs' and sweep cells'; W&B and CSV get the hyperparameters, every logger the numbers;
    :func:`~lightning_unlearn.callbacks.logger_media.log_hparams`). Hyperparameters: ``objective`` (the module's
    class), its init arguments as ``model.init_args.<dotted key>``, ``run_hparams``, the selected checkpoint's
    ``verdict`` class (``useful operating point``, ``unverified`` or ``apparent forgetting``: text, so the view can
    filter on it), its ``failed_guards`` and the ``guarded_verdict``. Metrics: ``<family>/selected/<x>`` for every
    ``x`` of :data:`SESSION_VALUES` and ``useful`` (1 for a useful operating point, else 0: a number, so the view can
    sort and plot it), ``<family>/guarded/step`` and ``<family>/guarded/<metric>``, ``<family>/first_collapse/step``,
    ``score/selected``, ``score/selected_step``, ``score/guarded_step`` and ``hp_metric`` (the selected ``metric``,
    else the score). In TensorBoard the session is the run ``<log_dir>/selection`` (``selection-<family>`` for a
    family other than ``sce``).

    - ``score`` (with ``score``): the checkpoint with the best declared combination of any row values, e.g. OU
      #187's ``{tofu/forget_quality: 0.5, tofu/model_utility: 0.5}``, and the best one holding the guards that
      apply to any run (retain ΔCE / KL, utility drop; :func:`~lightning_unlearn.metrics.selection.select_on_score`).
      A run without SCE rows (TOFU, MUSE, Lacuna) gets this part alone.

    The evaluators notify it after each row (``on_checkpoint_evaluated``), so callback order does not matter.

    Args:
        collapse_boundary: degraded-output rate that marks collapse.
        metric: the SCE variant selected on and drawn: ``sce`` (D = generation health or invalid answer, LENS
            Sec. 3), ``sce_health`` (health flags only) or ``sce_strict`` (also refusals and echoes).
        guards: bounds of the guarded selection (default: :class:`OperatingPointGuards` defaults).
        retain_family: metric family of the retain-drift rows read by the guards.
        utility_family: metric family of the utility rows read by the guards.
        family: the metric family holding SCE rows (``sce``, or ``sce:<name>`` for a named SCEEvaluation).
        run_name: the heatmap's row label (default: the logger's name, else ``run``).
        validity_calibration: a ``lens calibrate --validity_json`` file: the validity detectors' precision and
            recall against a manual sample of this narrative's answers (default: none, so no checkpoint is verified
            as a useful operating point).
        min_validity_recall: the share of broken answers D must catch for the detectors to count as verified.
        score: a declared combination to select on: ``{"<family>/<path>": weight}``, the weighted sum of row values
            (``tofu/forget_quality``, ``tofu/retain/prob``, ``mia/loss/auc``; keys of the row joined by ``/``). No
            expression is evaluated: a weight per value is the whole language.
        score_mode: ``max`` (the combination is better higher) or ``min``.
        run_hparams: further hyperparameters of the HParams session (flat keys; nested values are flattened), e.g.
            what tells this run from its siblings. ``fit --run_hparams '{...}'`` adds to them; ``lightning-unlearn
            sweep`` passes each cell's overrides, name, label and panel this way.
        output_dir: where ``checkpoint_metrics.jsonl`` is read and the outputs written; ``None``:
            :func:`~lightning_unlearn.callbacks.checkpoint_metrics_file.run_output_dir` (the logger's versioned
            directory, else ``<default_root_dir>/evaluation/version_N``).

    Raises:
        ValueError: ``collapse_boundary`` outside (0, 1], an unknown ``metric``, ``min_validity_recall``
            outside [0, 1], ``score_mode`` other than ``max`` / ``min``, or a malformed ``score``.

    Example::

        >>> from lightning_unlearn.callbacks import CheckpointSelection
        >>> selection = CheckpointSelection(score={"tofu/forget_quality": 0.5, "tofu/model_utility": 0.5})
        >>> selection.score  # checked and kept as floats; selects the best weighted sum of these row values
        {'tofu/forget_quality': 0.5, 'tofu/model_utility': 0.5}
    """

    def __init__(
        self,
        collapse_boundary: float = 0.5,
        metric: str = "sce",
        guards: OperatingPointGuards | None = None,
        retain_family: str = "retain_drift",
        utility_family: str = "utility",
        family: str = "sce",
        run_name: str | None = None,
        output_dir: str | None = None,
        validity_calibration: str | None = None,
        min_validity_recall: float = 0.8,
        score: dict[str, float] | None = None,
        score_mode: str = "max",
        run_hparams: dict[str, Any] | None = None,
    ) -> None:
        if not 0 < collapse_boundary <= 1:
            raise ConfigError(f"collapse_boundary={collapse_boundary} must be in (0, 1]: it is a degraded-output rate.")
        if metric not in SELECTION_METRICS:
            raise ConfigError(f"unknown selection metric {metric!r}; use one of {', '.join(SELECTION_METRICS)}.")
        if not 0 <= min_validity_recall <= 1:
            raise ConfigError(f"min_validity_recall={min_validity_recall} must be in [0, 1]: it is a recall.")
        if score_mode not in ("max", "min"):
            raise ConfigError(f"score_mode={score_mode!r}; use 'max' or 'min'.")
        self.score = None if score is None else check_score(score)
        self.score_mode = score_mode
        self.calibration = load_validity_calibration(validity_calibration)
        self.min_validity_recall = min_validity_recall
        self.collapse_boundary = collapse_boundary
        self.metric = metric
        self.guards = guards or OperatingPointGuards()
        self.retain_family = retain_family
        self.utility_family = utility_family
        self.family = family
        self.run_name = run_name
        self.output_dir = output_dir
        self.run_hparams = dict(run_hparams or {})
        self._dir: Path | None = None
        self._last_step = 0
        self.selection: dict | None = None
        self.stopped: dict | None = None

    @property
    @override
    def state_key(self) -> str:
        """Key of this callback's state in a checkpoint, built from the SCE ``family`` it selects on."""
        return self._generate_state_key(family=self.family)

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Fix the directory the metrics are read from and the selection written to.

        Args:
            trainer: the trainer (its run directory when ``output_dir`` is ``None``, chosen collectively).
            pl_module: the module trained or validated.
            stage: the trainer's stage.
        """
        self._dir = Path(self.output_dir) if self.output_dir else run_output_dir(trainer)

    def on_checkpoint_evaluated(self, trainer: Trainer, row: dict) -> None:
        """Called by every :class:`CheckpointEvaluator` on rank 0 right after it wrote ``row``."""
        families = {self.family} | {k.partition("/")[0] for k in self.score or ()}
        if row.get("family") in families:
            self.update(trainer)

    @override
    def on_run_stopped(self, trainer: Trainer, pl_module: LightningModule, bad_step: int, reason: str) -> None:
        """The stop rule fired: the selection says so and why, and never picks step ``bad_step`` or later (their rows
        are gone by the time :meth:`on_train_end` selects again)."""
        self.stopped = {"step": bad_step, "reason": reason}
        self.update(trainer)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """In ``validate``: select again from the metrics file and log the selection as an HParams session.

        Args:
            trainer: the trainer.
            pl_module: the module validated (its class and hyperparameters go into the session).
        """
        if trainer.state.fn == "validate":
            self.update(trainer)
            self.log_session(trainer, pl_module)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """At the end of ``fit``: the final selection (without any stopped steps) and its HParams session.

        Args:
            trainer: the trainer.
            pl_module: the module trained (its class and hyperparameters go into the session).
        """
        self.update(trainer)
        self.log_session(trainer, pl_module)

    def log_session(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The current selection as one HParams session (rank 0; see the class docstring)."""
        if world()[0] != 0 or not self.selection:
            return
        params = {
            "objective": type(pl_module).__name__,
            **hparams_values(pl_module.hparams, "model.init_args."),
            **hparams_values(self.run_hparams),
            **_verdict_hparams(self.selection),
        }
        run = "selection" if self.family == "sce" else f"selection-{self.family.replace(':', '-')}"
        log_hparams(trainer, run, params, _session_metrics(self.selection, self.family), self._last_step)

    def update(self, trainer: Trainer) -> dict | None:
        """Recompute the selection from the metrics file; write outputs on rank 0."""
        if world()[0] != 0 or self._dir is None:
            return None
        rows = read_rows(self._dir / METRICS_FILE)
        self._last_step = max((int(r["step"]) for r in rows), default=0)
        table = sce_table(rows, self.family)
        selection = table and select_from_rows(
            rows,
            self.family,
            self.collapse_boundary,
            self.metric,
            self.guards,
            self.retain_family,
            self.utility_family,
            self.calibration,
            self.min_validity_recall,
        )
        scored = self.score and select_on_score(
            rows, self.score, self.score_mode, self.guards, self.retain_family, self.utility_family
        )
        if not selection and not scored:
            self.selection = None  # nothing to select from (any more): no stale pick in the HParams session
            if self.stopped is not None:  # every evaluated checkpoint was discarded: say so instead of a stale pick
                write_json(self._dir / SELECTION_FILE, {"stopped": self.stopped})
                (self._dir / HEATMAP_FILE).unlink(missing_ok=True)
            return None
        selection = dict(selection or {})
        if scored:
            selection["score"] = scored
        if self.stopped is not None:
            selection["stopped"] = self.stopped
        self.selection = selection
        write_json(self._dir / SELECTION_FILE, self.selection)
        if scored:
            step = max(int(r["step"]) for r in rows)
            points = {"score/selected_step": scored["best"]["step"], "score/selected": scored["best"]["score"]}
            if scored["guarded"] is not None:
                points["score/guarded_step"] = scored["guarded"]["step"]
            for lg in trainer.loggers:
                lg.log_metrics(points, step=step)
        if not table:
            return self.selection
        name = self.run_name or (trainer.logger.name if trainer.logger is not None else None) or "run"
        fig = sce_heatmap_figure({str(name): table}, metric=self.metric)
        save_figure(fig, self._dir / HEATMAP_FILE)
        step = max(int(s) for lv in table.values() for s in lv)
        log_figure(trainer, f"{self.family}/heatmap", fig, step)
        tradeoff, guarded = self.selection["suppression_tradeoff"], self.selection["guarded"]
        scalars = {f"{self.family}/selected_step": tradeoff and tradeoff["step"],
                   f"{self.family}/guarded_step": guarded and guarded["step"]}  # fmt: skip
        for lg in trainer.loggers:
            lg.log_metrics({k: v for k, v in scalars.items() if v is not None}, step=step)
        lines = _verdict_text(self.selection).splitlines()
        log_table(trainer, f"{self.family}/verdict", ["verdict"], [[line] for line in lines], step)
        import matplotlib.pyplot as plt

        plt.close(fig)
        return self.selection


def _verdict_class(verdict: str) -> str:
    """``useful operating point``, ``unverified`` or ``apparent forgetting``: the verdict without its reasons."""
    return verdict.partition(":")[0]


def _verdict_hparams(selection: dict) -> dict[str, str]:
    """The selected checkpoint's verdict class and failed guards, and the guarded selection's verdict class."""
    point = selection.get("suppression_tradeoff") or (selection.get("score") or {}).get("best")
    if point is None:
        return {}
    failed = [name for name, guard in point["guards"].items() if guard["holds"] is False]
    out = {"verdict": _verdict_class(point["verdict"]), "failed_guards": ", ".join(failed) or "none"}
    if "guarded_verdict" in selection:
        out["guarded_verdict"] = _verdict_class(selection["guarded_verdict"])
    elif selection.get("score"):
        out["guarded_verdict"] = _verdict_class(selection["score"]["guarded_verdict"])
    return out


def _session_metrics(selection: dict, family: str) -> dict[str, float]:
    """The numbers of the HParams session (see :class:`CheckpointSelection`); a quantity not measured is left out."""
    out: dict[str, float] = {}
    point, metric = selection.get("suppression_tradeoff"), selection.get("metric")
    if point is not None:
        out.update({f"{family}/selected/{k}": point[k] for k in SESSION_VALUES if point.get(k) is not None})
        out[f"{family}/selected/useful"] = float(point["verdict"] == USEFUL)
        out["hp_metric"] = point[metric]
    guarded = selection.get("guarded")
    if guarded is not None:
        out[f"{family}/guarded/step"], out[f"{family}/guarded/{metric}"] = guarded["step"], guarded[metric]
    if selection.get("first_collapse") is not None:
        out[f"{family}/first_collapse/step"] = selection["first_collapse"]["step"]
    scored = selection.get("score")
    if scored:
        out["score/selected"], out["score/selected_step"] = scored["best"]["score"], scored["best"]["step"]
        if scored["guarded"] is not None:
            out["score/guarded_step"] = scored["guarded"]["step"]
        out.setdefault("hp_metric", scored["best"]["score"])
    return out


def _verdict_text(selection: dict) -> str:
    """One line per selected checkpoint: its step, SCE and verdict."""
    lines = []
    scored = selection.get("score")
    if scored:
        best = scored["best"]
        lines.append(f"score: step {best['step']}, {best['score']:.3f} — {best['verdict']}")
    for key in ("suppression_tradeoff", "guarded"):
        point = selection.get(key)
        if point is None:
            lines.append(f"{key}: none ({selection.get('guarded_verdict')})")
        else:
            lines.append(
                f"{key}: step {point['step']}, {selection['metric']} {point[selection['metric']]:.3f} — "
                f"{point['verdict']}"
            )
    return "  \n".join(lines)
