"""The shipped YAML configs: package data in this folder, found by name.

Like torchtune's ``tune ls`` / ``tune cp``: ``lightning-unlearn configs list`` names every shipped config, ``configs
copy lens/npo.yaml ./npo.yaml`` copies one to edit, and ``fit -c lens/npo.yaml`` resolves a shipped config by name
when no such file exists (a local file always wins).
"""

from __future__ import annotations

import os
import shutil
from importlib import resources
from pathlib import Path

from lightning_unlearn.errors import MissingPathError, PathExistsError

SUFFIX = ".yaml"


def config_root() -> Path:
    """The folder of shipped configs inside the installed package."""
    return Path(str(resources.files("lightning_unlearn") / "configs"))


def list_configs() -> list[str]:
    """Every shipped config as ``group/name.yaml`` (e.g. ``lens/npo.yaml``), sorted."""
    root = config_root()
    return sorted(p.relative_to(root).as_posix() for p in root.rglob(f"*{SUFFIX}"))


def shipped_config(name: str) -> Path:
    """The path of the shipped config ``name`` (``lens/npo.yaml``, ``lens/npo`` or ``configs/lens/npo.yaml``).

    Raises:
        FileNotFoundError: no such shipped config; the message lists the known ones.
    """
    rel = name.removeprefix("configs/")
    if not rel.endswith(SUFFIX):
        rel += SUFFIX
    path = config_root() / rel
    if not path.is_file():
        raise MissingPathError(
            f"no shipped config {name!r}; known: {', '.join(list_configs())} (`lightning-unlearn configs list`)."
        )
    return path


def resolve_config(name: str) -> str:
    """A ``-c`` argument as a path: an existing local file as it is, else the shipped config of that name."""
    if Path(name).expanduser().is_file():
        return name
    rel = name.removeprefix("configs/")
    if (config_root() / (rel if rel.endswith(SUFFIX) else rel + SUFFIX)).is_file():
        return str(shipped_config(name))
    return name  # neither: LightningCLI reports the missing file


def copy_config(name: str, destination: str, overwrite: bool = False) -> Path:
    """Copy the shipped config ``name`` to ``destination`` (a file, or a folder to copy into)."""
    source = shipped_config(name)
    dest = Path(destination)
    if dest.is_dir() or str(destination).endswith(("/", os.sep)) or not dest.suffix:
        dest = dest / source.name  # a folder (existing, or named as one: a trailing slash or no .yaml suffix)
    if dest.exists() and not overwrite:
        raise PathExistsError(f"{str(dest)!r} exists; pass --overwrite true to replace it.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    return dest


def option_classes(class_path: str, path: list[str]) -> list[tuple[str, list[str]]]:
    """For a dotted path of options under ``class_path`` (e.g. ``["optim", "lr"]``), each level's owner and its valid
    options, as far as the parameters' annotations name a dataclass (``OptimizerConfig | None`` → OptimizerConfig).
    Stops at ``class_path`` / ``init_args`` and at any other annotation: a base class such as a Strategy or a
    Callback is given by a ``class_path`` naming a subclass with options of its own.

    Returns:
        ``[(owner, options), …]``, one pair per level checked: ``path[i]`` must be among ``options`` of pair ``i``.
    """
    import dataclasses
    import importlib
    import inspect
    import types
    import typing

    out = []
    owner = class_path
    for i, option in enumerate(path):
        valid = init_parameters(owner)
        if not valid or option in ("init_args", "class_path"):
            break
        out.append((owner, valid))
        if option not in valid or i == len(path) - 1:
            break
        try:  # the class the option's annotation names, if one
            module, name = owner.rsplit(".", 1)
            cls = getattr(importlib.import_module(module), name)
            init = next(c.__init__ for c in cls.__mro__ if "__init__" in vars(c) and option in
                        inspect.signature(c.__init__).parameters)  # fmt: skip
            hint = typing.get_type_hints(init).get(option)
        except Exception:  # noqa: BLE001 - unresolvable annotations: stop checking here
            break
        members = (
            typing.get_args(hint)
            if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
            else (hint,)
        )
        classes = [m for m in members if inspect.isclass(m) and dataclasses.is_dataclass(m)]
        if len(classes) != 1:
            break
        owner = f"{classes[0].__module__}.{classes[0].__qualname__}"
    return out


def init_parameters(class_path: str) -> list[str]:
    """The constructor parameters of ``class_path`` (``package.module.Class``) and its bases; empty when it does not
    import. For "did you mean" hints and for checking a sweep's keys before anything runs."""
    import importlib
    import inspect

    try:
        module, name = class_path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        names = {n for c in cls.__mro__ if "__init__" in vars(c) for n in inspect.signature(c.__init__).parameters}
    except Exception:  # noqa: BLE001 - a class that does not import is named by the run itself
        return []
    return sorted(names - {"self", "args", "kwargs"})
