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


def _module_imports() -> dict[str, set[str]]:
    """Every package module → the package modules it imports anywhere (top level or inside a function), relative
    imports resolved, ``from a import b`` counted as ``a.b`` where ``b`` is a module."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("lightning_unlearn", *path.relative_to(PACKAGE).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        edges[name] = found
    return {name: {t for t in targets if modules[t].name != "__init__.py"}  # a package's re-exports are no layer
            for name, targets in edges.items() if modules[name].name != "__init__.py"}  # fmt: skip


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_modules_not_even_through_an_import_inside_a_function():
    assert _cycles(_module_imports()) == []


def test_the_cycle_walk_sees_a_cycle_hidden_in_a_function():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    walked = _module_imports()
    # masked_gradients reads the masks' bit layout; the walk must see that edge, imported at the top or not
    assert "lightning_unlearn.masks" in walked["lightning_unlearn.strategies.masked_gradients"]
    assert "lightning_unlearn.models" in walked["lightning_unlearn.masks"]  # imported inside weights' fingerprint
