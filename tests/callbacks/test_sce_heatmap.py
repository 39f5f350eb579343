"""The SCE heatmap is laid out as LENS Fig. 3: rows = method trajectories, columns = checkpoint steps, one panel per
level, the run labels once on the left, and each cell annotated with its value."""

from __future__ import annotations

import pytest

from lightning_unlearn.callbacks.sce_heatmap import save_figure, sce_heatmap_figure

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)


def test_heatmap_panels_share_row_labels_and_annotate_every_cell(tmp_path):
    runs = {"npo lr 5e-5": 0.1, "tofu_ga lr 2e-4": 0.5}
    tables = {
        run: {level: {step: {"sce": round(base + 0.1 * k + 0.01 * step, 2)} for step in (10, 20, 30)}
              for k, level in enumerate(("L0", "L1", "L2", "pooled"))}
        for run, base in runs.items()
    }  # fmt: skip
    fig = sce_heatmap_figure(tables)
    panels = [ax for ax in fig.axes if ax.get_title()]  # the colour bar has no title
    assert [ax.get_title() for ax in panels] == ["L0", "L1", "L2", "pooled"]
    assert [t.get_text() for t in panels[0].get_yticklabels()] == list(runs)
    assert all(not label.get_visible() or not label.get_text() for ax in panels[1:] for label in ax.get_yticklabels())
    for ax, level in zip(panels, ("L0", "L1", "L2", "pooled")):
        texts = sorted(t.get_text() for t in ax.texts)
        expected = sorted(f"{tables[r][level][s]['sce']:.2f}" for r in runs for s in (10, 20, 30))
        assert texts == expected  # one annotation per cell, with its SCE
    save_figure(fig, tmp_path / "heatmap.png")
    assert (tmp_path / "heatmap.png").stat().st_size > 1000


def test_a_panel_title_stands_clear_of_the_level_titles():
    """The report's narrative × language title sat on the level titles of a two-run figure (drawn over "L2")."""
    tables = {run: {lv: {s: {"sce": 0.1} for s in range(10, 70, 10)} for lv in ("L0", "L1", "L2", "pooled")}
              for run in ("npo", "tofu_ga")}  # fmt: skip
    fig = sce_heatmap_figure(tables, title="nato-forced-war-en")
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    levels = [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
    assert fig._suptitle.get_text() == "nato-forced-war-en" and len(levels) == 4
    assert all(title.y0 >= box.y1 for box in levels)
