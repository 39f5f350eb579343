"""The SCE heatmap (rows = runs/methods, columns = checkpoint steps, one panel per level) and atomic writers."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from lightning_unlearn.atomic import write_file_atomically, write_text_atomically

HEATMAP_LEVELS = ("L0", "L1", "L2", "pooled")


def sce_heatmap_figure(
    tables: Mapping[str, Mapping[str, Mapping[int, dict]]],
    levels: Sequence[str] = HEATMAP_LEVELS,
    metric: str = "sce",
    title: str | None = None,
):
    """Matplotlib figure: one panel per level, rows = runs, columns = checkpoint steps, colour = SCE in [0, 1].

    Args:
        tables: run name → :func:`~lightning_unlearn.metrics.selection.sce_table` of that run.
        levels: panels, left to right (levels absent from every run are dropped).
        metric: the SCE variant shown: ``sce``, ``sce_health`` or ``sce_strict`` (LENS Fig. 3 style panels of one).
        title: a line above the level titles (the report's narrative × language panel).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    levels = [lv for lv in levels if any(lv in t for t in tables.values())] or ["pooled"]
    runs = list(tables)
    steps = sorted({s for t in tables.values() for lv in levels for s in t.get(lv, {})})
    width = max(3.0, 0.42 * max(len(steps), 1) + 0.6)
    label_width = 0.09 * max((len(r) for r in runs), default=4) + 0.4
    fig, axes = plt.subplots(
        1,
        len(levels),
        figsize=(width * len(levels) + label_width + 1.2, 1.0 + 0.42 * len(runs)),
        squeeze=False,
        sharey=True,  # the run labels once, on the left, as in LENS Fig. 3
    )
    for k, (ax, level) in enumerate(zip(axes[0], levels)):
        grid = np.full((len(runs), max(len(steps), 1)), np.nan)
        for i, run in enumerate(runs):
            for j, step in enumerate(steps):
                cell = tables[run].get(level, {}).get(step)
                if cell is not None and cell.get(metric) is not None:
                    grid[i, j] = cell[metric]
        im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            if not np.isnan(value):  # the value in each cell; dark text on the bright end of viridis
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6,
                        color="black" if value > 0.6 else "white")  # fmt: skip
        ax.set_title(level)
        ax.set_xticks(range(len(steps)), [str(s) for s in steps], rotation=90, fontsize=7)
        ax.set_xlabel("step")
        if k == 0:
            ax.set_yticks(range(len(runs)), runs, fontsize=7)
        else:
            ax.tick_params(axis="y", left=False, labelleft=False)
    fig.colorbar(im, ax=axes[0].tolist(), label=metric.upper().replace("_", " "), shrink=0.8)
    if title:  # a few points above the highest level title, which reaches the figure's top edge on a figure this short
        fig.draw_without_rendering()  # places the level titles (their height depends on the font's metrics)
        top = max(ax.title.get_window_extent().y1 for ax in axes[0]) / fig.bbox.height
        fig.suptitle(title, y=top + 3 / 72 / fig.get_figheight(), va="bottom")
    return fig


def save_figure(fig, path: str | os.PathLike) -> None:
    """Write ``fig`` as PNG atomically."""
    write_file_atomically(path, lambda tmp: fig.savefig(tmp, dpi=100, bbox_inches="tight"), suffix=".png")


def write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as JSON atomically."""
    write_text_atomically(path, json.dumps(obj, indent=2, ensure_ascii=False))
