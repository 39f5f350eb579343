"""Docstrings: nearly every public definition has one, and every callback and objective shows a runnable example."""

from __future__ import annotations

import ast
import doctest
import inspect
from pathlib import Path

import pytest
from lightning.pytorch import Callback, LightningModule

import lightning_unlearn
import lightning_unlearn.callbacks
import lightning_unlearn.objectives

PACKAGE = Path(lightning_unlearn.__file__).parent
MAX_MISSING_SHARE = 0.05


def public_definitions(tree: ast.Module, path: str) -> list[tuple[str, bool]]:
    """``(path:line:qualified name, has a docstring)`` of every public module- or class-level ``def`` / ``class``.

    Class bodies are walked (nested classes and their methods included), function bodies are not: a helper defined
    inside a function is no public definition.
    """
    found: list[tuple[str, bool]] = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if node.name.startswith("_"):
                continue
            found.append((f"{path}:{node.lineno}:{prefix}{node.name}", ast.get_docstring(node) is not None))
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")

    walk(tree.body, "")
    return found


def test_public_definitions_walk_class_bodies_but_not_function_bodies():
    source = '''
class Outer:
    """Documented."""

    def method(self):
        def inner():
            pass

    class Nested:
        def deep(self):
            """Documented."""

    def _private(self):
        pass


def function():
    """Documented."""
'''
    found = dict(public_definitions(ast.parse(source), "m.py"))
    assert found == {
        "m.py:2:Outer": True,
        "m.py:5:Outer.method": False,
        "m.py:9:Outer.Nested": False,
        "m.py:10:Outer.Nested.deep": True,
        "m.py:17:function": True,
    }


def test_at_most_five_percent_of_public_definitions_lack_a_docstring():
    definitions = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        definitions += public_definitions(tree, str(path.relative_to(PACKAGE.parent)))
    missing = [name for name, documented in definitions if not documented]
    assert definitions, f"no public definition found under {PACKAGE}"
    share = len(missing) / len(definitions)
    assert share <= MAX_MISSING_SHARE, (
        f"{len(missing)} of {len(definitions)} public definitions ({share:.1%}) lack a docstring, more than "
        f"{MAX_MISSING_SHARE:.0%}:\n" + "\n".join(missing)
    )


def _exported(module, base: type) -> list[type]:
    return [obj for name in module.__all__ if inspect.isclass(obj := getattr(module, name)) and issubclass(obj, base)]


EXAMPLED = _exported(lightning_unlearn.callbacks, Callback) + _exported(lightning_unlearn.objectives, LightningModule)


def test_every_callback_and_objective_is_checked():
    names = {cls.__name__ for cls in EXAMPLED}
    assert {"SCEEvaluation", "StopRule", "QuantizationAttack", "NPO", "UnlearningModule", "InjectionModule"} <= names
    assert "OptimizerConfig" not in names  # exported by objectives, but no LightningModule


@pytest.mark.parametrize("cls", EXAMPLED, ids=lambda cls: cls.__name__)
def test_class_docstring_has_a_runnable_example(cls: type):
    doc = cls.__doc__ or ""
    assert "Example::" in doc, f"{cls.__qualname__}'s docstring has no `Example::` section."
    # recurse=False: the class's own docstring, not its methods'
    tests = doctest.DocTestFinder(recurse=False).find(cls, cls.__qualname__, globs={})
    runner = doctest.DocTestRunner()
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"{cls.__qualname__}'s `Example::` holds no `>>>` example."
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {cls.__qualname__} failed (above)."
