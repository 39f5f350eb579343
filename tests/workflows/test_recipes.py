"""A result built from another recipe is refused by name; one of the same recipe is reused."""

from __future__ import annotations

import pytest

from lightning_unlearn.workflows.fit_command import FitCommand
from lightning_unlearn.workflows.recipes import check_recipe, record_recipe


def test_check_recipe_records_nothing_itself_and_refuses_other_overrides_naming_them(tmp_path):
    path = tmp_path / "stage" / "recipe.json"
    recipe = {"configs": ["a: 1\n"], "overrides": {"trainer.max_steps": "8", "seed": "0"}, "label": "x"}
    assert check_recipe(path, recipe, "cell 'stage'", "this sweep's", "Delete it.") is None
    record_recipe(path, recipe)
    relabelled = {**recipe, "label": "y"}  # a key outside configs/overrides does not decide the result
    assert check_recipe(path, relabelled, "cell 'stage'", "this sweep's", "Delete it.") == recipe
    other = {**recipe, "overrides": {"trainer.max_steps": "9", "seed": "0"}}
    refused = r"cell 'stage' was built with other overrides than this sweep's \(trainer.max_steps\); .* Delete it\."
    with pytest.raises(ValueError, match=refused):
        check_recipe(path, other, "cell 'stage'", "this sweep's", "Delete it.")
    with pytest.raises(ValueError, match="other config files than this sweep's; reusing"):
        check_recipe(path, {**recipe, "configs": ["a: 2\n"]}, "cell 'stage'", "this sweep's", "Delete it.")


def test_a_fit_commands_recipe_keeps_config_text_and_overrides_not_paths_or_the_resume_point(tmp_path):
    import torch

    config = tmp_path / "inject.yaml"
    config.write_text("trainer: {max_steps: 3}\n")
    fit = FitCommand([config], tmp_path / "run", ["--data.data_dir", str(tmp_path / "data")])
    recipe = fit.recipe(tmp_path)
    assert recipe["configs"] == ["trainer: {max_steps: 3}\n"] and len(recipe["code"]) == 16
    # the shape the Lacuna chain has recorded since before FitCommand: its stages stay reusable
    assert recipe["overrides"] == ["--data.data_dir", "<workdir>/data", "--trainer.default_root_dir", "<workdir>/run"]
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    torch.save({"global_step": 3}, tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert fit.args()[-2:] == ["--ckpt_path", "last"] and fit.recipe(tmp_path) == recipe  # resuming changes no recipe
    moved = FitCommand([tmp_path / "elsewhere.yaml"], tmp_path / "run", fit.overrides)
    (tmp_path / "elsewhere.yaml").write_text(config.read_text())
    assert moved.recipe(tmp_path)["configs"] == recipe["configs"]  # where a config lives is not in it
