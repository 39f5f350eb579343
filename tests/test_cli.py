import subprocess
import sys

import pytest

from lightning_unlearn.cli import EXTRA_COMMANDS, main


def test_fit_help_lists_trainer_model_and_data_options():
    out = subprocess.run(
        [sys.executable, "-m", "lightning_unlearn.cli", "fit", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for option in ("--trainer.strategy", "--trainer.num_nodes", "--model", "--data", "--ckpt_path"):
        assert option in out.stdout


def test_top_level_help_lists_the_extra_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "fit" in printed and "validate" in printed
    for name in EXTRA_COMMANDS:
        assert name in printed


def test_every_extra_command_resolves_to_a_callable():
    import importlib

    for name, target in EXTRA_COMMANDS.items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name
