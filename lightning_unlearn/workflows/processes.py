"""Stage subprocesses that die with their parent: no orphan keeps training after a chain is killed.

Two mechanisms, because either alone leaves a gap:

- each child asks the kernel for SIGTERM when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``), which covers a
  parent killed with SIGKILL;
- :func:`terminate_children_on_exit` turns SIGTERM / SIGHUP in the parent into ``SystemExit`` and, on any exit,
  terminates (then kills) every child still running, which covers platforms without ``prctl``.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence

_PR_SET_PDEATHSIG = 1
_children: list[subprocess.Popen] = []


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
