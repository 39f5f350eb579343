"""What fixes a run's data and its order: the datamodule's settings and the content of every file they name.

A checkpoint records this fingerprint (the project's datamodules save it through Lightning's datamodule state), and
``fit --ckpt_path`` compares it with the configured data before anything is written: a resume whose forget file,
seed or batch size changed would train on another data order, so "exact resume" would quietly stop being true. The
CLI refuses such a resume with one line naming the change, unless ``--allow_data_change true`` (then the change is
logged and recorded in the run's config and in the new checkpoints' data state).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

# Settings that change neither the rows nor their order.
NOT_ORDER_DEFINING = frozenset({"num_workers", "pin_memory", "persistent_workers", "truncation"})
# Files inside a named directory whose size stands for their content (model weights beside a tokenizer).
SIZE_ONLY = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")
STATE_KEY = "data_fingerprint"


def content_hash(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, or of a directory's relative file names and contents (weights by size only)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode("utf-8") + b"\0")
        if file.suffix in SIZE_ONLY:
            digest.update(str(file.stat().st_size).encode("ascii"))
            continue
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def _plain(value):
    """JSON-comparable form of a setting (tuples as lists, paths as strings)."""
    return json.loads(json.dumps(value, default=str))


def data_fingerprint(settings: Mapping) -> dict:
    """``{setting: value}`` for every order-defining setting, plus ``{setting + "#content": hash}`` for each one
    naming an existing file or directory (a list of paths: each element)."""
    out = {}
    for key in sorted(settings):
        if key in NOT_ORDER_DEFINING or key.startswith("_"):
            continue
        value = _plain(settings[key])
        out[key] = value
        paths = value if isinstance(value, list) else [value]
        hashes = [content_hash(v) for v in paths if isinstance(v, str) and v and Path(v).exists()]
        if hashes:
            out[f"{key}#content"] = hashes if isinstance(value, list) else hashes[0]
    return out


def fingerprint_changes(saved: Mapping, current: Mapping) -> list[str]:
    """One line per difference between a checkpoint's fingerprint and the configured data's (a file that moved with
    its bytes unchanged is no difference)."""
    lines = []
    for key in sorted(set(saved) | set(current)):
        if key == "changes" or saved.get(key) == current.get(key):
            continue
        if key.endswith("#content"):
            setting = key.removesuffix("#content")
            if saved.get(setting) == current.get(setting):  # same path, other bytes
                lines.append(f"the content of {setting} ({current.get(setting)}) changed since the checkpoint")
            continue  # a changed path is reported by its own key
        content = f"{key}#content"
        if saved.get(content) is not None and saved.get(content) == current.get(content):
            continue  # the same bytes at another path: the file moved, the data did not change
        lines.append(f"{key}: checkpoint {saved.get(key)!r} → configured {current.get(key)!r}")
    return lines


def saved_fingerprint(checkpoint: Mapping) -> dict | None:
    """The data fingerprint a checkpoint's datamodule state holds, or None (a checkpoint of another datamodule)."""
    for value in checkpoint.values():
        if isinstance(value, Mapping) and isinstance(value.get(STATE_KEY), Mapping):
            return dict(value[STATE_KEY])
    return None


class FingerprintedData:
    """Mixin for a ``LightningDataModule`` with ``save_hyperparameters()``: its checkpoint state is the data
    fingerprint of its settings (computed once per process), with any data changes a resume was allowed."""

    _fingerprint: dict | None = None
    data_changes: list[str] = []

    def state_dict(self) -> dict:
        """The data fingerprint of this datamodule's settings (computed once) and the data changes allowed so far.

        Returns:
            ``{STATE_KEY: {...fingerprint, "changes": [...]}}``, saved in every checkpoint.
        """
        if self._fingerprint is None:
            self._fingerprint = data_fingerprint(dict(self.hparams))
        return {STATE_KEY: {**self._fingerprint, "changes": list(self.data_changes)}}

    def load_state_dict(self, state_dict: dict) -> None:
        """Carry the checkpoint's recorded data changes over, ahead of any this resume was allowed.

        Args:
            state_dict: what :meth:`state_dict` returned when the checkpoint was saved.
        """
        saved = state_dict.get(STATE_KEY) or {}
        self.data_changes = [*saved.get("changes", []), *self.data_changes]
