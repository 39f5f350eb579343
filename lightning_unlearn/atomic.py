"""Atomic writes of artifact directories: build in a temporary sibling, then rename into place.

A crash or a bad input while writing leaves the previous directory (or nothing) behind, never a partial one that a
later stage would trust.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_directory_atomically(target: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_dir)``, then move ``tmp_dir`` to ``target`` (replacing it); on error nothing is left."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        write(tmp)
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
