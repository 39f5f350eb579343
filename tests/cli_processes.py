"""Command lines run as real processes at the cost of a fork.

A cold ``python -m lightning_unlearn.cli`` spends 5-8 s of CPU here importing torch, Lightning and transformers before
it reads its arguments; the bad-input suite runs some eighty command lines. :class:`CommandProcesses` starts one
clean interpreter (not pytest's: no capture, no logging handlers, no warning filters of its own) that imports those
packages once and then forks a child per command line. The child is a real process: its own file descriptors 0-2
(stdout and stderr go to files the test reads), working directory, environment and ``sys.argv``, and it runs the
module as ``python -m`` does (:func:`runpy.run_module` with ``run_name="__main__"``) at the top level of the server
script, so a ``SystemExit`` or an uncaught exception is handled by the interpreter itself: its exit status, its message
or traceback on stderr. What differs from a cold start is only that the preloaded modules are already imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# The server: read one request per line on stdin, fork, answer the child's exit status on stdout. The child leaves
# the loop and runs the module at this script's top level.
_SERVER = r"""
import json, os, runpy, sys
for name in sys.argv[1:]:
    __import__(name)
sys.stdout.write("ready\n"); sys.stdout.flush()

def serve():
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush(); sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return request
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(f"{os.waitstatus_to_exitcode(status)}\n"); sys.stdout.flush()
    return None

request = serve()
if request is not None:
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(request["stdout"], os.O_WRONLY | os.O_TRUNC), 1)
    os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_TRUNC), 2)
    os.chdir(request["cwd"])
    os.environ.clear(); os.environ.update(request["env"])
    sys.argv = ["-m", *request["argv"]]
    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
"""


class CommandProcesses:
    """Runs ``[sys.executable, "-m", module, *args]`` command lines as forked children of one preloaded interpreter.

    Args:
        module: the module each command line runs (``python -m module``).
        preload: modules the server imports once before it forks.
        env: extra environment of the server and of every child.
    """

    def __init__(self, module: str, preload: list[str], env: dict[str, str] | None = None) -> None:
        self.module = module
        self.env = {**os.environ, **(env or {})}
        self._lock = threading.Lock()
        self._log = tempfile.TemporaryFile()
        script = _SERVER.replace("MODULE", repr(module))
        self._server = subprocess.Popen(
            [sys.executable, "-c", script, *preload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=self.env,
        )  # fmt: skip
        if self._server.stdout.readline() != "ready\n":
            self._log.seek(0)
            raise RuntimeError(f"the command server did not start: {self._log.read().decode()[-3000:]}")

    def run(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
        """Runs one command line (``argv`` starts with ``sys.executable, "-m", module``) in ``cwd``."""
        prefix = [sys.executable, "-m", self.module]
        assert argv[:3] == prefix, argv
        with tempfile.TemporaryDirectory() as folder, self._lock:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            out.touch(), err.touch()
            request = {"argv": argv[3:], "cwd": str(cwd), "env": self.env, "stdout": str(out), "stderr": str(err)}
            self._server.stdin.write(json.dumps(request) + "\n")
            self._server.stdin.flush()
            status = self._server.stdout.readline()
            if not status:
                self._log.seek(0)
                raise RuntimeError(f"the command server died: {self._log.read().decode()[-3000:]}")
            return subprocess.CompletedProcess(
                argv, int(status), out.read_text(errors="replace"), err.read_text(errors="replace")
            )

    def close(self) -> None:
        self._server.stdin.close()
        self._server.wait(timeout=60)
        self._log.close()
