"""What a stage's result depends on (its recipe), recorded beside the result: a directory built from another recipe
is refused by name, never silently reused.

A recipe is a JSON mapping. Its ``configs`` (the text of the ``-c`` files, not where they live) and ``overrides``
decide the result: when they differ from the recorded ones, :func:`check_recipe` raises one ``ValueError`` naming
the directory, what differs and the fix. Other keys travel with it and are the caller's to judge: the Lacuna chain's
``code`` (a digest of the package source, :func:`code_digest`: code defaults are in no config) only warns, a sweep
cell's report labels are rewritten. The Lacuna chain records ``<stage>/recipe.json``, a sweep ``<cell>/cell.json``,
the localization report ``<run>/recipe.json`` (a run of another recipe is fitted again there: seconds, not hours).
The chain's and the report's recipes are :meth:`~lightning_unlearn.workflows.fit_command.FitCommand.recipe`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import lightning_unlearn
from lightning_unlearn.atomic import write_text_atomically
from lightning_unlearn.errors import ConfigError

# The recipe keys that decide a result.
RECIPE_KEYS = ("configs", "overrides")


@functools.cache
def code_digest() -> str:
    """A digest of this package's source files: a result built by other code may differ in what code defaults gave."""
    package = Path(lightning_unlearn.__file__).resolve().parent
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def recorded_recipe(path: str | os.PathLike) -> dict | None:
    """The recipe recorded at ``path``, ``None`` when there is none."""
    path = Path(path)
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def record_recipe(path: str | os.PathLike, recipe: Mapping) -> None:
    """Record ``recipe`` at ``path`` (atomically; its directory is made)."""
    write_text_atomically(path, json.dumps(recipe, indent=1))


def _changed(found, wanted) -> list[str]:
    """The overrides that differ: list items in one and not the other, or mapping keys whose values differ."""
    if isinstance(found, Mapping) and isinstance(wanted, Mapping):
        return sorted(k for k in set(found) | set(wanted) if found.get(k) != wanted.get(k))
    return sorted(set(map(str, found or [])) ^ set(map(str, wanted or [])))


def check_recipe(path: str | os.PathLike, recipe: Mapping, built: str, ours: str, fix: str) -> dict | None:
    """Refuse a result whose recorded recipe (at ``path``) has other configs or overrides than ``recipe``.

    Args:
        path: the recipe file beside the result.
        recipe: this run's recipe.
        built: what the result is, for the message (``"stage inject in '<dir>'"``).
        ours: whose recipe ``recipe`` is, for the message (``"this run's"``).
        fix: the sentence that says what to do (``"Delete '<dir>' to rebuild it, or …"``).

    Returns:
        The recorded recipe, or ``None`` when none is recorded (the caller records ``recipe``, or not).
    """
    found = recorded_recipe(path)
    if found is None:
        return None
    if {k: found.get(k) for k in RECIPE_KEYS} != {k: recipe.get(k) for k in RECIPE_KEYS}:
        what = "config files" if found.get("configs") != recipe.get("configs") else "overrides"
        changed = _changed(found.get("overrides"), recipe.get("overrides")) if what == "overrides" else []
        raise ConfigError(
            f"{built} was built with other {what} than {ours}" + (f" ({', '.join(changed)})" if changed else "")
            + f"; reusing it would mix two recipes. {fix}"
        )  # fmt: skip
    return found


__all__ = ["RECIPE_KEYS", "check_recipe", "code_digest", "record_recipe", "recorded_recipe"]
