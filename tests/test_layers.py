"""Two layers: nothing outside ``lightning_unlearn/workflows/`` imports it (cli.py dispatches to it by name)."""

from __future__ import annotations

import ast
from pathlib import Path

import lightning_unlearn

PACKAGE = Path(lightning_unlearn.__file__).parent


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_no_library_module_imports_the_workflows():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "workflows":
            continue
        bad = [
            n
            for n in _imports(path)
            if n == "lightning_unlearn.workflows" or n.startswith("lightning_unlearn.workflows.")
        ]
        if bad:
            offenders[str(rel)] = bad
    assert offenders == {}, f"library modules import the workflows layer: {offenders}"


def test_the_walk_sees_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from lightning_unlearn.workflows.lens import prepare\nimport lightning_unlearn.workflows\n")
    assert "lightning_unlearn.workflows.lens" in _imports(probe) and "lightning_unlearn.workflows" in _imports(probe)
