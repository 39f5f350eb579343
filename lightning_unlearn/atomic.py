"""Atomic writes of artifacts (directories and single files): build in a temporary sibling, then rename into place.

A crash or a bad input while writing leaves the previous artifact (or nothing) behind, never a partial one that a
later stage would trust.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path


def _umask() -> int:
    """The process umask. Linux reports it in /proc (a read, safe with other threads creating files); elsewhere it
    is set and restored, which briefly changes it for every thread."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


def write_directory_atomically(target: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_dir)``, then move ``tmp_dir`` to ``target`` (replacing it); on error nothing is left."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 → the mode a plain mkdir would give
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


def write_file_atomically(target: str | os.PathLike, write: Callable[[Path], None], suffix: str = ".tmp") -> Path:
    """Call ``write(tmp_file)`` on a temporary sibling of ``target``, then move it onto ``target``.

    ``suffix`` is the temporary file's extension, for writers that infer the format from it (e.g. ``.png``).
    On error the temporary file is removed and ``target`` is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        # mkstemp's 0600 → the mode a plain open() would give; after the write, since some writers (safetensors)
        # replace the file rather than write into it
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_text_atomically(target: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``target`` atomically."""
    return write_file_atomically(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_texts_atomically(files: Mapping[str | os.PathLike, str]) -> None:
    """Write several UTF-8 files that belong together (e.g. a JSONL and its ``.meta.json``): every one is staged in
    a temporary sibling first, and only when all are staged are they renamed into place; on error none is."""
    staged: list[tuple[Path, Path]] = []
    try:
        for target, text in files.items():
            target = Path(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            os.chmod(tmp, 0o666 & ~_umask())
            staged.append((Path(tmp), target))
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, target in staged:
        os.replace(tmp, target)


def remove_stale_temporaries(root: str | os.PathLike) -> list[Path]:
    """Delete the temporaries (``.<name>.*.tmp`` files and directories) an interrupted atomic write left anywhere
    under ``root``; call it only while no other process writes there (a run holding the directory's lock)."""
    removed = []
    root = Path(root)
    if not root.is_dir():
        return removed
    for tmp in sorted(root.rglob(".*.tmp"), key=lambda p: len(p.parts), reverse=True):
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed
