"""The forked command runner gives what a cold ``python -m`` gives: exit status, stdout and stderr, byte for byte."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli_processes import CommandProcesses

PROBE = """
import os, sys
print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()), "env", os.environ.get("PROBE_ENV"))
what = sys.argv[1]
if what == "raise":
    raise ValueError("a bug")
if what == "message":
    raise SystemExit("probe: error: one line")
if what == "status":
    sys.exit(3)
"""


@pytest.mark.parametrize("what", ["raise", "message", "status", "fine"])
def test_a_forked_command_exits_and_writes_as_a_cold_python_dash_m(tmp_path, what):
    (tmp_path / "probe_module.py").write_text(PROBE, encoding="utf-8")
    env = {"PROBE_ENV": "seen", "PYTHONPATH": str(tmp_path)}
    processes = CommandProcesses("probe_module", ["json"], env)
    try:
        forked = processes.run([sys.executable, "-m", "probe_module", what], tmp_path)
    finally:
        processes.close()
    cold = subprocess.run([sys.executable, "-m", "probe_module", what], cwd=tmp_path, capture_output=True,
                          text=True, env=processes.env)  # fmt: skip
    assert (forked.returncode, forked.stdout) == (cold.returncode, cold.stdout)
    if what == "raise":  # the same traceback but for runpy's own frames (run_module here, _run_module_as_main there)
        ours = [line for line in forked.stderr.splitlines() if "<frozen runpy>" not in line and "<string>" not in line]
        theirs = [line for line in cold.stderr.splitlines() if "<frozen runpy>" not in line]
        assert ours == theirs
    else:
        assert forked.stderr == cold.stderr
    assert forked.returncode == {"raise": 1, "message": 1, "status": 3, "fine": 0}[what]
    assert f"argv ['{what}'] cwd {tmp_path.name} env seen" in forked.stdout
    assert ("Traceback" in forked.stderr) == (what == "raise")
