"""Reading a checkpoint before resuming from it: refuse a corrupt one by name, and refuse one built for another model.

LightningCLI's default re-parses a checkpoint's saved hyperparameters into the config, so ``validate --ckpt_path``
with another model's checkpoint evaluates *that* model and a resumed ``fit`` silently drops command-line changes.
Here the configured model is the model: :func:`resume_conflicts` compares the configuration with the checkpoint's
hyperparameters, the keys that say *which* model it is must agree, and the others (learning rate, loss weights, …)
take the configured value, which the caller records.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import torch

# Hyperparameters that name the model a checkpoint's weights belong to: a resume must not change them.
IDENTITY_KEYS = ("model_path", "adapter", "masks_path", "forget_groups", "tiny", "derive", "masked", "num_groups")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names it and what to do."""


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The checkpoint at ``path`` (loaded on CPU, ``weights_only``), or :class:`CheckpointError` naming it corrupt and
    the newest other checkpoint beside it that reads."""
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - every failure to read means the same thing to the user
        older = _readable_sibling(path)
        hint = f" The newest readable checkpoint beside it is {str(older)!r}." if older else ""
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt or not a Lightning checkpoint ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:120] if str(err) else 'no detail'}); it was probably cut off by a kill during "
            f"its write.{hint}"
        ) from None


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The checkpoint a resume continues from, anywhere under ``root`` (every logger version): the newest
    ``last.ckpt``, else the ``step=N.ckpt`` with the largest N; a file that does not read is skipped."""
    root = Path(root)
    if not root.is_dir():
        return None
    lasts = sorted(root.rglob("last*.ckpt"), key=lambda p: p.stat().st_mtime_ns, reverse=True)

    def step(p: Path) -> int:
        digits = p.stem.removeprefix("step=").split("-")[0]
        return int(digits) if digits.isdigit() else -1

    steps = sorted((p for p in root.rglob("*.ckpt") if step(p) >= 0), key=step, reverse=True)
    for candidate in [*lasts, *steps]:
        try:
            torch.load(candidate, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - a truncated or foreign file is not a resume point
            logging.getLogger("lightning_unlearn").warning("skipping %s: corrupt or not a checkpoint", candidate)
            continue
        return candidate
    return None


def _readable_sibling(path: Path) -> Path | None:
    for other in sorted(path.parent.glob("*.ckpt"), key=lambda p: p.stat().st_mtime_ns, reverse=True):
        if other == path:
            continue
        try:
            torch.load(other, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001
            continue
        return other
    return None


def _same(a, b) -> bool:
    if isinstance(a, str) and isinstance(b, str) and ("/" in a or "/" in b or a.startswith("~")):
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return all(_same(a.get(k), b.get(k)) for k in set(a) | set(b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def resume_conflicts(configured: Mapping, saved: Mapping) -> tuple[list[str], list[str]]:
    """``(refused, changed)`` between the configured model's init arguments and a checkpoint's hyperparameters.

    ``refused`` names every :data:`IDENTITY_KEYS` entry whose value differs (the checkpoint is another model's);
    ``changed`` every other key the configuration sets to another value (the resumed run applies the configured one).
    Each entry reads ``key: checkpoint <saved> → configured <configured>``.
    """
    refused, changed = [], []
    for key in sorted(set(configured) & set(saved)):
        if _same(configured[key], saved[key]):
            continue
        line = f"{key}: checkpoint {saved[key]!r} → configured {configured[key]!r}"
        (refused if key in IDENTITY_KEYS else changed).append(line)
    return refused, changed


LOCK_FILE = ".lightning_unlearn.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire_run_lock(root: str | os.PathLike) -> Path:
    """Take ``<root>/.lightning_unlearn.lock`` (pid, host, start time) so one run at a time writes into ``root``.

    A lock left by a process that no longer runs on this host is stale and replaced; one held by a live process (or
    by another host, which cannot be checked) raises :class:`RunDirectoryBusy` naming it.
    """
    import json
    import socket
    import time

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                held = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                held = {}
            pid, host = int(held.get("pid", -1)), held.get("host")
            if host == me["host"] and pid > 0 and not _alive(pid):
                logging.getLogger("lightning_unlearn").warning("removing the stale lock of pid %d in %s", pid, root)
                path.unlink(missing_ok=True)
                continue
            raise RunDirectoryBusy(
                f"{str(root)!r} is in use by another run (pid {pid} on {host}, lock {str(path)!r}); wait for it, give "
                "this run its own trainer.default_root_dir, or delete the lock if that run is gone."
            ) from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return path
    raise RunDirectoryBusy(f"could not take the lock {str(path)!r}; another run keeps re-creating it.")


def release_run_lock(path: str | os.PathLike) -> None:
    """Remove a lock taken by :func:`acquire_run_lock` in this process (a lock of another process stays)."""
    import json

    path = Path(path)
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


class RunDirectoryBusy(RuntimeError):
    """Another live run writes into the same run directory."""
