"""Every YAML under configs/ parses against the code (LightningCLI --print_config validates without running)."""

import re
from pathlib import Path

import pytest
import yaml

from lightning_unlearn.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ALL = sorted(CONFIGS.rglob("*.yaml"))
# An overlay (trainer settings, or model/data init_args without a class_path) is parsed on top of a full config:
# the one its header runs it with (`-c configs/BASE.yaml -c configs/OVERLAY.yaml`), else BASE.
BASE = CONFIGS / "lens" / "npo.yaml"


def _base_for(path: Path, header: str) -> Path:
    own = re.escape(f"configs/{path.relative_to(CONFIGS).as_posix()}")
    found = re.search(r"-c (configs/\S+\.yaml)\s+(?:\\\s*#?\s*)?-c " + own, header)
    return CONFIGS.parent / found.group(1) if found else BASE


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
    files = [_base_for(path, header), path] if _is_overlay(cfg) else [path]
    argv = ["fit"] + [a for f in files for a in ("-c", str(f))] + ["--print_config"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code in (0, None), capsys.readouterr().err
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"].startswith("lightning_unlearn.")
