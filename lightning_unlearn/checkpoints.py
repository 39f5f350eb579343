"""Reading a checkpoint before resuming from it: refuse a corrupt one by name, and refuse one built for another model.

LightningCLI's default re-parses a checkpoint's saved hyperparameters into the config, so ``validate --ckpt_path``
with another model's checkpoint evaluates *that* model and a resumed ``fit`` silently drops command-line changes.
Here the configured model is the model: :func:`resume_conflicts` compares the configuration with the checkpoint's
hyperparameters, the keys that say *which* model it is must agree, and the others (learning rate, loss weights, …)
take the configured value, which the caller records.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from lightning_unlearn.errors import ConfigError, UserError

log = logging.getLogger("lightning_unlearn")

# Hyperparameters that name the model a checkpoint's weights belong to: a resume must not change them.
IDENTITY_KEYS = ("model_path", "adapter", "masks_path", "forget_groups", "tiny", "derive", "masked", "num_groups")


class CheckpointError(ConfigError):
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
    ``last.ckpt``, else the ``step=N.ckpt`` with the largest N; a file that does not read (cut off by a kill during
    its write) is skipped with a warning. The one finder of a run's resume point: the CLI's ``--ckpt_path last``, the
    Lacuna chain's stages and the sweep's cells all resume from what it returns."""
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
            torch.load(candidate, map_location="cpu", weights_only=True, mmap=True)  # mmap: no full read
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


class RunDirectoryBusy(UserError, RuntimeError):
    """Another live run writes into the same run directory."""


# -- RNG state: what dropout and sampling draw from, saved per rank so a resumed run draws the same numbers -------
def rng_states() -> dict:
    """This process's RNG states (torch CPU and CUDA, numpy, python) as tensors and plain lists, so a checkpoint
    holding them still loads with ``weights_only=True``."""
    import random

    import numpy as np

    _, keys, pos, has_gauss, cached = np.random.get_state()
    version, state, gauss_next = random.getstate()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },  # fmt: skip
        "python": {"version": version, "state": list(state), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: Mapping) -> None:
    """Restore what :func:`rng_states` returned."""
    import random

    import numpy as np

    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = states["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Whatever runs inside (a checkpoint evaluation) leaves every RNG as it found it, so evaluating or not, and
    resuming or not, cannot change the random numbers training draws next."""
    states = rng_states()
    try:
        yield
    finally:
        set_rng_states(states)


def save_rng_states(checkpoint: dict) -> None:
    """``checkpoint["rng_states"]``: every rank's :func:`rng_states`, in rank order (a collective: every rank calls
    it, as Lightning calls ``on_save_checkpoint`` on every rank)."""
    from lightning_unlearn.distributed import all_gather_objects

    checkpoint["rng_states"] = all_gather_objects(rng_states())


def saved_rng_states(checkpoint: Mapping) -> dict | None:
    """This rank's entry of ``checkpoint["rng_states"]``; ``None`` (with a warning) when the checkpoint has none or
    was saved by another number of ranks: the resumed run then draws other random numbers than an uninterrupted one."""
    from lightning_unlearn.distributed import world

    saved = checkpoint.get("rng_states")
    rank, size = world()
    if not saved or len(saved) != size:
        reason = "holds no RNG states" if not saved else f"was saved by {len(saved)} ranks, not {size}"
        logging.getLogger("lightning_unlearn").warning(
            "the checkpoint %s: dropout and sampling after the resume draw other numbers than the uninterrupted "
            "run would",
            reason,
        )
        return None
    return saved[rank]


class RestoresRNG:
    """LightningModule mixin (before ``LightningModule`` in the bases): checkpoints carry every rank's RNG states,
    and a resumed ``fit`` restores them in ``on_train_start`` (after the restore, the sanity check and the
    evaluators' base pass), so dropout draws what it would have drawn in the uninterrupted run. A subclass that
    overrides these hooks calls ``super()``."""

    _resumed_rng: dict | None = None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Add every rank's RNG states to the checkpoint being saved.

        Args:
            checkpoint: the checkpoint dict, changed in place.
        """
        super().on_save_checkpoint(checkpoint)
        save_rng_states(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """For a resumed ``fit``, keep this rank's saved RNG states until :meth:`on_train_start` restores them.

        Args:
            checkpoint: the loaded checkpoint dict.
        """
        super().on_load_checkpoint(checkpoint)
        if self._trainer is not None and self.trainer.state.fn == "fit":
            self._resumed_rng = saved_rng_states(checkpoint)

    def on_train_start(self) -> None:
        """Restore the RNG states of the checkpoint a ``fit`` resumed from (once; a fresh run keeps its own)."""
        super().on_train_start()
        if self._resumed_rng is not None:
            set_rng_states(self._resumed_rng)
            self._resumed_rng = None


# -- which step a checkpoint holds -----------------------------------------------------------------------------------
# A sharded checkpoint (a directory: each rank wrote its own shard) keeps its non-tensor state, global_step included,
# in this file; Lightning's ModelParallelStrategy and MaskedFSDPStrategy both write it.
SHARDED_METADATA_FILE = "meta.pt"


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The ``global_step`` a checkpoint holds, a single file or a sharded directory (memory-mapped, so large files
    cost no read); ``None`` when it does not load."""
    path = Path(path)
    source = path / SHARDED_METADATA_FILE if path.is_dir() else path
    try:
        return int(torch.load(source, map_location="cpu", weights_only=True, mmap=True).get("global_step", -1))
    except Exception:  # noqa: BLE001 - a truncated or foreign file holds no step
        return None


def atomic_checkpoint_io():
    """A ``TorchCheckpointIO`` whose saves are atomic: the checkpoint is written to a temporary sibling and renamed
    into place, so a write that fails (a full disk, a kill) removes its temporary and leaves every earlier
    checkpoint, ``last.ckpt`` included, as it was. The CLI installs it on every strategy that saves single files."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    from lightning_unlearn.atomic import write_file_atomically

    class AtomicCheckpointIO(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
            if storage_options is not None:
                raise TypeError("AtomicCheckpointIO takes no storage_options.")

            def write(tmp: Path) -> None:
                try:
                    torch.save(checkpoint, tmp)
                except RuntimeError as err:
                    # torch's zip writer reports a failed write as "[enforce fail at inline_container.cc] . unexpected
                    # pos …" (a RuntimeError, not an OSError): name the disk's state instead, while the partial
                    # temporary still holds its space
                    if "inline_container" not in str(err) and "PytorchStreamWriter" not in str(err):
                        raise
                    code = errno.ENOSPC if shutil.disk_usage(tmp.parent).free < 1 << 20 else errno.EIO
                    raise OSError(code, os.strerror(code), str(path)) from err

            try:
                write_file_atomically(path, write, suffix=".ckpt.tmp")
            except OSError as err:
                log.error("checkpoint %s was not written (%s); its temporary was removed and the earlier "
                          "checkpoints are as they were", path, err.strerror or err)  # fmt: skip
                raise

    return AtomicCheckpointIO()
