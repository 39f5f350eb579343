"""Killing a chain leaves no stage running: SIGTERM (handled) and SIGKILL (the kernel's parent-death signal)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from lightning_unlearn.workflows import processes


def _wait_for_child(parent: psutil.Process, needle: str, timeout: float = 120.0) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in parent.children(recursive=True):
            try:
                if needle in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no child running {needle!r} within {timeout} s")


def _alive_with(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_killing_lacuna_run_leaves_no_stage_alive(tmp_path, sig):
    workdir = tmp_path / f"chain-{sig.name}"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    chain = subprocess.Popen(
        [sys.executable, "-m", "lightning_unlearn.cli", "lacuna", "run", "--size", "tiny", "--workdir", str(workdir)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        stage = _wait_for_child(psutil.Process(chain.pid), "fit")
        chain.send_signal(sig)
        chain.wait(timeout=60)
        psutil.wait_procs([stage], timeout=30)
        assert not stage.is_running() or stage.status() == psutil.STATUS_ZOMBIE
        assert _alive_with(str(workdir)) == []
    finally:
        for p in _alive_with(str(workdir)):
            p.kill()
        if chain.poll() is None:
            chain.kill()


def test_terminate_children_on_exit_stops_a_sleeping_child():
    with pytest.raises(SystemExit) as exit_info, processes.terminate_children_on_exit():
        child = processes.spawn([sys.executable, "-c", "import time; time.sleep(60)"])
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert exit_info.value.code == 128 + signal.SIGTERM
    assert child.wait(timeout=10) is not None and child.returncode != 0


def test_a_stage_started_inside_a_distributed_job_is_a_job_of_its_own(tmp_path, monkeypatch):
    """A stage launched from rank 1 of a torchrun job inherits none of its rank variables, and gets its threads."""
    for key, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MY_SETTING", "kept")
    show = "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', " \
        "'MASTER_PORT', 'OMP_NUM_THREADS', 'TOKENIZERS_PARALLELISM', 'MY_SETTING')}))"  # fmt: skip
    log_file = tmp_path / "stage" / "stage.log"
    assert processes.run_stage([sys.executable, "-c", show], threads=3, log_file=log_file) == 0
    seen = json.loads(log_file.read_text())
    assert seen == {"RANK": None, "LOCAL_RANK": None, "WORLD_SIZE": None, "MASTER_PORT": None,
                    "OMP_NUM_THREADS": "3", "TOKENIZERS_PARALLELISM": "false", "MY_SETTING": "kept"}  # fmt: skip
    processes.run_stage([sys.executable, "-c", "print('again')"], log_file=log_file, append=True)
    assert log_file.read_text().splitlines()[-1] == "again" and len(log_file.read_text().splitlines()) == 2


def test_a_stages_progress_lines_are_followed_from_its_log_file_as_it_writes_them(tmp_path):
    script = (
        "import sys, time\n"
        "print('Some warning the stage prints', flush=True)\n"
        "print('fit: training from step 0 to 4', flush=True)\n"
        "for step in (2, 4):\n"
        "    time.sleep(0.3)\n"
        "    print(f'fit: step {step}/4 ({25 * step} %) · epoch 0', flush=True)\n"
        "sys.stdout.write('fit: step 4/4 (100 %) · done')\n"  # the last line without its newline
    )
    log_file = tmp_path / "stage.log"
    proc = processes.spawn_stage([sys.executable, "-c", script], log_file=log_file)
    seen: list[tuple[float, str]] = []
    follower = processes.follow_progress(log_file, proc, lambda line: seen.append((time.monotonic(), line)),
                                         poll_seconds=0.05)  # fmt: skip
    assert proc.wait() == 0
    ended = time.monotonic()
    follower.join(timeout=10)
    assert [line for _, line in seen] == [
        "fit: training from step 0 to 4",
        "fit: step 2/4 (50 %) · epoch 0",
        "fit: step 4/4 (100 %) · epoch 0",
        "fit: step 4/4 (100 %) · done",
    ]
    assert seen[0][0] < ended - 0.3  # passed on while the stage ran, not read after it
    assert "Some warning" in log_file.read_text(encoding="utf-8")  # the whole output stays in the file
