"""The workflows read as named steps: no function body in ``lightning_unlearn/workflows`` runs past 80 lines (its
docstring not counted: a command's docstring is its ``--help``) unless its docstring says why ("Long because")."""

from __future__ import annotations

import ast
from pathlib import Path

WORKFLOWS = Path(__file__).resolve().parents[2] / "lightning_unlearn" / "workflows"
LIMIT = 80


def long_functions(root: Path = WORKFLOWS, limit: int = LIMIT) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            doc = ast.get_docstring(node) or ""
            body = node.body[1:] if doc else node.body
            lines = body[-1].end_lineno - body[0].lineno + 1 if body else 0
            if lines > limit and "Long because" not in doc:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_workflow_function_runs_past_80_lines_without_a_reason():
    assert long_functions() == []


def test_the_rule_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    source = f'def f():\n    """Doc."""\n{body}\n\n\ndef g():\n    """Long because: a table."""\n{body}\n'
    (tmp_path / "m.py").write_text(source)
    assert long_functions(tmp_path) == ["m.py:1 f (81 lines)"]
