"""Every shipped YAML parses against the code (LightningCLI --print_config validates without running), and loads
by its shipped name (``fit -c lens/npo.yaml``) as well as by path."""

import re
from pathlib import Path

import pytest
import yaml

from lightning_unlearn.cli import main
from lightning_unlearn.configs import config_root, copy_config, list_configs, resolve_config

CONFIGS = config_root()
ALL = sorted(CONFIGS.rglob("*.yaml"))
# An overlay (trainer settings, or model/data init_args without a class_path) is parsed on top of a full config:
# the one its header runs it with (`-c BASE.yaml -c OVERLAY.yaml`, shipped names), else BASE.
BASE = CONFIGS / "lens" / "npo.yaml"


def _base_for(path: Path, header: str) -> Path:
    own = re.escape(path.relative_to(CONFIGS).as_posix())
    found = re.search(r"-c (\S+\.yaml)\s+(?:\\\s*#?\s*)?-c " + own, header)
    return CONFIGS / found.group(1) if found else BASE


def _with_bases(path: Path, header: str) -> list[Path]:
    """``path`` after the configs its header runs it on, an overlay's own base first (``-c inject.yaml -c
    inject_separable.yaml``)."""
    base = _base_for(path, header)
    text = base.read_text()
    if base == BASE or not _is_overlay(yaml.safe_load(text)):
        return [base, path]
    return [*_with_bases(base, "\n".join(line for line in text.splitlines()[:40] if line.startswith("#"))), path]


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
    if path.parent.name == "sweeps":  # a sweep file, not a fit config: it parses as one and lists its cells
        from lightning_unlearn.workflows.sweep import sweep_command

        cells = sweep_command(path, dry_run=True)["cells"]
        assert cells and len({c["name"] for c in cells}) == len(cells)
        assert all(c["label"] and c["panel"] for c in cells), "every cell is a row of a panel of the report"
        return
    files = _with_bases(path, header) if _is_overlay(cfg) else [path]
    argv = ["fit"] + [a for f in files for a in ("-c", str(f))] + ["--print_config"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code in (0, None), capsys.readouterr().err
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"].startswith("lightning_unlearn.")


def test_configs_list_copy_and_resolve_by_name(tmp_path, monkeypatch, capsys):
    assert "lens/npo.yaml" in list_configs() and "lacuna/pretrain.yaml" in list_configs()
    assert resolve_config("lens/npo.yaml") == str(CONFIGS / "lens" / "npo.yaml")
    assert resolve_config("configs/lens/npo") == str(CONFIGS / "lens" / "npo.yaml")
    local = tmp_path / "lens" / "npo.yaml"
    local.parent.mkdir()
    local.write_text("seed_everything: 1\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_config("lens/npo.yaml") == "lens/npo.yaml"  # a local file always wins
    dest = copy_config("lens/tofu_ga.yaml", str(tmp_path))
    assert dest.read_text() == (CONFIGS / "lens" / "tofu_ga.yaml").read_text()
    with pytest.raises(FileExistsError, match="overwrite"):
        copy_config("lens/tofu_ga.yaml", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="known: lacuna/alphaedit.yaml"):
        copy_config("lens/nope.yaml", str(tmp_path))
    main(["configs", "list"])
    assert "lens/npo.yaml" in capsys.readouterr().out
    main(["configs", "copy", "lens/ga_retain.yaml", str(tmp_path / "mine.yaml")])
    assert (tmp_path / "mine.yaml").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "-c", "lacuna/inject.yaml", "--print_config"])  # no such local file: the shipped one
    assert exit_info.value.code in (0, None)
    assert "InjectionModule" in capsys.readouterr().out
