"""Figures, tables and HParams sessions for every logger the trainer has: TensorBoard, Weights & Biases, MLflow and
CSV.

Scalars go through ``logger.log_metrics``, which every Lightning logger has; figures and tables do not, so each
logger gets them its own way: TensorBoard ``add_figure`` / ``add_text`` (a Markdown table), W&B ``log_image`` /
``log_table``, MLflow ``log_figure`` / ``log_table`` on the run, CSV a PNG and a CSV file under
``<log_dir>/media/`` beside ``metrics.csv``. Other loggers get the scalars only. Rank 0 calls these.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

from lightning_unlearn.atomic import write_text_atomically


def log_figure(trainer: Trainer, key: str, figure, step: int) -> None:
    """``figure`` (matplotlib) under ``key`` at ``step`` in every logger that keeps images."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_figure(key, figure, global_step=step, close=False)
        elif isinstance(logger, WandbLogger):
            logger.log_image(key=key, images=[figure], step=step)
        elif isinstance(logger, MLFlowLogger):
            logger.experiment.log_figure(logger.run_id, figure, f"{_file_name(key)}/step={step}.png")
        elif isinstance(logger, CSVLogger):
            from lightning_unlearn.callbacks.sce_heatmap import save_figure

            save_figure(figure, _media_dir(logger) / f"{_file_name(key)}-step={step}.png")


def log_table(trainer: Trainer, key: str, columns: Sequence[str], rows: Sequence[Sequence], step: int) -> None:
    """A table (text cells) under ``key`` at ``step`` in every logger that keeps tables or text."""
    cells = [[str(c) for c in row] for row in rows]
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text(key, _markdown(columns, cells), global_step=step)
        elif isinstance(logger, WandbLogger):
            logger.log_table(key=key, columns=list(columns), data=cells, step=step)
        elif isinstance(logger, MLFlowLogger):
            table = {c: [row[i] for row in cells] for i, c in enumerate(columns)}
            logger.experiment.log_table(logger.run_id, table, f"{_file_name(key)}/step={step}.json")
        elif isinstance(logger, CSVLogger):
            out = io.StringIO()
            writer = csv.writer(out)
            writer.writerow(columns)
            writer.writerows(cells)
            write_text_atomically(_media_dir(logger) / f"{_file_name(key)}-step={step}.csv", out.getvalue())


def hparams_values(params: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """``params`` as the flat values TensorBoard's HParams view takes: nested mappings and dataclasses become dotted
    keys (``optim.lr``), lists and other values JSON text, paths text; ``None`` and private (``_…``) keys are left
    out. Each key is ``prefix`` + its dotted path."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in params.items():
        if str(key).startswith("_"):
            continue  # LightningCLI's _instantiator, a checkpoint's _class_path: not settings
        name = f"{prefix}{key}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if isinstance(value, Mapping):
            out.update(hparams_values(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
        elif isinstance(value, os.PathLike):
            out[name] = os.fspath(value)
        elif value is not None:
            out[name] = json.dumps(value, default=str)
    return out


def log_hparams(trainer: Trainer, run: str, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
    """One HParams session: ``params`` (flattened by :func:`hparams_values`) against ``metrics``, in every logger that
    records hyperparameters, and ``metrics`` as scalars at ``step`` in every logger.

    TensorBoard: the session is a run of its own, ``<log_dir>/<run>``, holding only its start and end info and
    ``metrics``; each call replaces that run's event file. Why not ``TensorBoardLogger.log_hyperparams``: TensorBoard
    reads the first session of a run (Lightning's ``hp_metric`` -1 one, with ``default_hp_metric=True``) and the
    first ``experiment`` summary of the whole log directory, which ``log_hyperparams`` writes with this run's keys
    only, hiding every other run's. With sessions alone the HParams view takes its columns from the union of the
    sessions' keys, and a session's metrics from the scalars under its run. An ``hp_metric`` in ``metrics`` also goes
    to the logger's own run, where Lightning's own session (if any) reads it instead of -1. W&B and CSV get
    ``log_hyperparams``; MLflow the scalars only (a parameter cannot change once logged; a re-selection changes it).
    """
    values = hparams_values(params)
    metrics = {k: float(v) for k, v in metrics.items()}
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            _tensorboard_session(Path(logger.log_dir) / run, values, metrics, step)
            if "hp_metric" in metrics:
                logger.log_metrics({"hp_metric": metrics["hp_metric"]}, step=step)
            continue
        if isinstance(logger, WandbLogger | CSVLogger):  # not MLFlowLogger: see above
            logger.log_hyperparams(values)
        logger.log_metrics(metrics, step=step)


def _tensorboard_session(directory: Path, values: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
    """Write the session (start info, ``metrics`` as scalars, end info) as the only event file of ``directory``."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from torch.utils.tensorboard.summary import scalar
    from torch.utils.tensorboard.writer import FileWriter

    start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for key, value in values.items():
        if isinstance(value, bool):  # before int: a bool is an int
            start.hparams[key].bool_value = value
        elif isinstance(value, int | float):
            start.hparams[key].number_value = value
        else:
            start.hparams[key].string_value = value
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())

    def summary(tag: str, data: plugin_data_pb2.HParamsPluginData) -> Summary:
        return Summary(value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data))])

    started = summary(metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start))
    ended = summary(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end))
    for old in directory.glob("events.out.tfevents.*"):
        # The run holds one session: TensorBoard would read the first one left here. (Evaluation jobs of one run
        # side by side each re-select; the last, after them all, leaves the final session.)
        old.unlink(missing_ok=True)
    writer = FileWriter(str(directory))
    try:
        writer.add_summary(started, step)
        for tag, value in metrics.items():
            writer.add_summary(scalar(tag, value), step)
        writer.add_summary(ended, step)
    finally:
        writer.close()


def _markdown(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
    def row(values):
        return "| " + " | ".join(v.replace("|", "\\|").replace("\n", " ") for v in values) + " |"

    return "\n".join([row(columns), "|" + "---|" * len(columns), *(row(r) for r in cells)])


def _file_name(key: str) -> str:
    return key.replace("/", "-").replace(":", "-")


def _media_dir(logger: CSVLogger) -> Path:
    return Path(logger.log_dir) / "media"
