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
        raise FileNotFoundError(
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
        raise FileExistsError(f"{str(dest)!r} exists; pass --overwrite true to replace it.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    return dest


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
