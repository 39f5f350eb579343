"""Every YAML under configs/ parses against the code (LightningCLI --print_config validates without running)."""

from pathlib import Path

import pytest
import yaml

from lightning_unlearn.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ALL = sorted(CONFIGS.rglob("*.yaml"))
# An overlay (trainer settings, or model/data init_args without a class_path) is parsed on top of a full config.
BASE = CONFIGS / "lens" / "npo.yaml"


def _is_overlay(cfg: dict) -> bool:
    model = cfg.get("model")
    return not (isinstance(model, dict) and "class_path" in model)


def test_configs_are_shipped():
    assert {p.parent.name for p in ALL} >= {"trainer", "lacuna", "lens"}


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_shipped_config_parses_and_says_how_to_run_it(path, capsys):
    text = path.read_text()
    cfg = yaml.safe_load(text)
    assert isinstance(cfg, dict) and cfg, path
    header = "\n".join(line for line in text.splitlines()[:40] if line.startswith("#"))
    assert "lightning-unlearn" in header or "scripts/" in header, f"{path}: the header must say how to run it"
    files = [BASE, path] if _is_overlay(cfg) else [path]
    argv = ["fit"] + [a for f in files for a in ("-c", str(f))] + ["--print_config"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code in (0, None), capsys.readouterr().err
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"].startswith("lightning_unlearn.")
