"""A result built from another recipe is refused by name; one of the same recipe is reused."""

from __future__ import annotations

import pytest

from lightning_unlearn.workflows.recipes import check_recipe, command_recipe, record_recipe


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


def test_command_recipe_keeps_config_text_and_overrides_not_paths_or_the_resume_point(tmp_path):
    config = tmp_path / "inject.yaml"
    config.write_text("trainer: {max_steps: 3}\n")
    cmd = ["python", "-m", "lightning_unlearn.cli", "fit", "-c", str(config), "--data.data_dir",
           str(tmp_path / "data"), "--ckpt_path", str(tmp_path / "last.ckpt")]  # fmt: skip
    recipe = command_recipe(cmd, tmp_path)
    assert recipe["configs"] == ["trainer: {max_steps: 3}\n"]
    assert recipe["overrides"] == ["--data.data_dir", "<workdir>/data"] and len(recipe["code"]) == 16
