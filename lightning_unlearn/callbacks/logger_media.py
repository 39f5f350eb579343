"""Figures and tables for every logger the trainer has: TensorBoard, Weights & Biases, MLflow and CSV.

Scalars go through ``logger.log_metrics``, which every Lightning logger has; figures and tables do not, so each
logger gets them its own way: TensorBoard ``add_figure`` / ``add_text`` (a Markdown table), W&B ``log_image`` /
``log_table``, MLflow ``log_figure`` / ``log_table`` on the run, CSV a PNG and a CSV file under
``<log_dir>/media/`` beside ``metrics.csv``. Other loggers get the scalars only. Rank 0 calls these.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

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


def _markdown(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
    def row(values):
        return "| " + " | ".join(v.replace("|", "\\|").replace("\n", " ") for v in values) + " |"

    return "\n".join([row(columns), "|" + "---|" * len(columns), *(row(r) for r in cells)])


def _file_name(key: str) -> str:
    return key.replace("/", "-").replace(":", "-")


def _media_dir(logger: CSVLogger) -> Path:
    return Path(logger.log_dir) / "media"
