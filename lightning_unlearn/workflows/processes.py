"""Stage subprocesses: the environment a stage runs in, its log file, and dying with its parent.

A stage (a ``lightning-unlearn`` command that the Lacuna chain, the localization report or a sweep launches) runs in
:func:`stage_env`: its own job, never a rank of a distributed job that launched it. :func:`spawn_stage` and
:func:`run_stage` start one with its output in a log file.

No orphan keeps training after a chain is killed; two mechanisms, because either alone leaves a gap:

- each child asks the kernel for SIGTERM when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``), which covers a
  parent killed with SIGKILL;
- :func:`terminate_children_on_exit` turns SIGTERM / SIGHUP in the parent into ``SystemExit`` and, on any exit,
  terminates (then kills) every child still running, which covers platforms without ``prctl``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_children: list[subprocess.Popen] = []

# What a launcher (torchrun, Lightning's own, a SLURM task through Lightning) tells a process about its place in a
# distributed job. A stage is a job of its own: inheriting them, it would take itself for one rank of the parent's job
# (or bind the parent's MASTER_PORT).
RANK_VARIABLES = ("LOCAL_RANK", "RANK", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(cmd: Sequence[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kwargs)`` whose child gets SIGTERM when this process dies, tracked for cleanup."""
    proc = subprocess.Popen(list(cmd), preexec_fn=_die_with_parent, **kwargs)  # noqa: PLW1509
    _children.append(proc)
    return proc


def run(cmd: Sequence[str], **kwargs) -> int:
    """:func:`spawn` and wait; the exit code."""
    return spawn(cmd, **kwargs).wait()


def thread_budget() -> int:
    """The threads this process's stages may use between them: every core, or fewer where the caller set
    ``OMP_NUM_THREADS`` to a whole number (a machine it shares, a test suite of one process per core)."""
    cores = os.cpu_count() or 1
    limit = os.environ.get("OMP_NUM_THREADS", "")
    return min(cores, int(limit)) if limit.isdigit() and int(limit) > 0 else cores


def stage_env(threads: int | None = None) -> dict[str, str]:
    """The environment of a stage subprocess: this process's without :data:`RANK_VARIABLES`; with ``threads``, that
    many OpenMP / MKL threads (stages side by side share the cores); tokenizers without a thread pool of their own;
    the model hub offline unless the caller says otherwise."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def spawn_stage(
    cmd: Sequence[str], threads: int | None = None, log_file: str | os.PathLike | None = None, append: bool = False
) -> subprocess.Popen:
    """:func:`spawn` a stage in :func:`stage_env`; its stdout and stderr go to ``log_file`` (overwritten, or added to
    with ``append``) or, without one, to this process's."""
    if log_file is None:
        return spawn(cmd, env=stage_env(threads))
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a" if append else "w", encoding="utf-8") as out:  # the child keeps its own copy of the fd
        return spawn(cmd, env=stage_env(threads), stdout=out, stderr=subprocess.STDOUT)


# The lines of :class:`~lightning_unlearn.callbacks.LogProgress` in a stage's log ("fit: training from step 0 to 300",
# "fit: step 59/300 (20 %) · …").
PROGRESS_LINE = re.compile(r"^fit: (training from step|step \d)")


def follow_progress(
    log_file: str | os.PathLike,
    proc: subprocess.Popen,
    emit: Callable[[str], None],
    poll_seconds: float = 0.5,
    start: int = 0,
) -> threading.Thread:
    """Pass each progress line a stage writes to ``log_file`` to ``emit`` while ``proc`` runs (a daemon thread).

    ``start``: the byte offset to read from (the file's size before the stage began, for a log it appends to).

    The stage's whole output stays in its file; a chain or sweep whose own output goes to a file shows the stages'
    progress lines there, so a slow stage can be told from a hung one. Join the thread after ``proc`` ends to have
    every line passed on.
    """

    def follow() -> None:
        with open(log_file, encoding="utf-8", errors="replace") as f:
            f.seek(start)
            pending = ""
            while True:
                chunk = f.read()
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        if PROGRESS_LINE.match(line.strip()):
                            emit(line.strip())
                elif proc.poll() is not None:
                    if PROGRESS_LINE.match(pending.strip()):  # a last line without its newline
                        emit(pending.strip())
                    return
                else:
                    time.sleep(poll_seconds)

    thread = threading.Thread(target=follow, daemon=True, name=f"progress of {Path(log_file).parent.name}")
    thread.start()
    return thread


def run_stage(
    cmd: Sequence[str], threads: int | None = None, log_file: str | os.PathLike | None = None, append: bool = False
) -> int:
    """:func:`spawn_stage` and wait; the exit code."""
    return spawn_stage(cmd, threads, log_file, append).wait()


def _stop_children(timeout: float = 10.0) -> None:
    for proc in _children:
        if proc.poll() is None:
            proc.terminate()
    for proc in _children:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _children.clear()


@contextlib.contextmanager
def terminate_children_on_exit() -> Iterator[None]:
    """While active, SIGTERM and SIGHUP end this process through ``SystemExit``; on leaving (normally or not) every
    child started with :func:`spawn` that still runs is terminated."""

    def _exit(signum, frame):  # noqa: ARG001
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, _exit) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        _stop_children()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
