"""Training progress as log lines: the line worked out from a trainer's state, periodic lines and the last one, and
`lightning-unlearn fit` writing them when its output goes to a file."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from lightning_unlearn.callbacks.log_progress import LogProgress


def _trainer(step: int, total: int = 900, **metrics) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, max_steps=total, current_epoch=0, is_global_zero=True,
                           callback_metrics=metrics)  # fmt: skip


def test_the_line_gives_steps_pace_time_left_and_the_loss():
    progress = LogProgress(every_seconds=30)
    progress._start, progress._start_step = 100.0, 20  # resumed at step 20, at t = 100 s
    line = progress.line(_trainer(120, **{"train/loss": 2.31449}), now=242.0)
    # 100 steps in 142 s: 1.42 s/step; 780 steps left: 1108 s, about 18 min
    assert line == "fit: step 120/900 (13 %) · epoch 0 · 1.42 s/step · about 18 min left · train/loss 2.314"
    assert progress.line(_trainer(5, total=-1), now=110.0).startswith("fit: step 5 · epoch 0")  # epoch-bounded
    with pytest.raises(ValueError, match="every_seconds=0 must both be positive"):
        LogProgress(every_seconds=0)
    with pytest.raises(ValueError, match="every_percent=0 and"):
        LogProgress(every_percent=0)


def test_lines_come_every_so_often_and_once_at_the_end(caplog, monkeypatch):
    clock = iter([0.0, 10.0, 31.0, 40.0, 70.0, 75.0])
    monkeypatch.setattr("lightning_unlearn.callbacks.log_progress.time.monotonic", lambda: next(clock))
    progress = LogProgress(every_percent=100, every_seconds=30, metric=None)  # by time only
    with caplog.at_level(logging.INFO, logger="lightning_unlearn"):
        progress.on_train_start(_trainer(0, 10), None)
        for step, _ in zip(range(1, 5), range(4)):  # batches end at t = 10, 31, 40, 70
            progress.on_train_batch_end(_trainer(step, 10), None, None, None, step)
        progress.on_train_end(_trainer(4, 10), None)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "fit: training from step 0 to 10"
    assert [line.split(" · ")[0] for line in lines[1:]] == ["fit: step 2/10 (20 %)", "fit: step 4/10 (40 %)",
                                                              "fit: step 4/10 (40 %)"]  # fmt: skip
    assert lines[-1].endswith(" · done") and "18.75 s/step" in lines[-1]


def test_a_line_each_time_another_few_percent_of_the_steps_pass(caplog, monkeypatch):
    monkeypatch.setattr("lightning_unlearn.callbacks.log_progress.time.monotonic", lambda: 5.0)  # no time passes
    progress = LogProgress(every_percent=25, metric=None)
    epochs = SimpleNamespace(**vars(_trainer(0, -1)), estimated_stepping_batches=40)  # 40 steps, by epochs
    with caplog.at_level(logging.INFO, logger="lightning_unlearn"):
        progress.on_train_start(epochs, None)
        for step in range(1, 41):
            epochs.global_step = step
            progress.on_train_batch_end(epochs, None, None, None, step)
    lines = [r.getMessage().split(" · ")[0] for r in caplog.records]
    assert lines == ["fit: training from step 0 to 40", "fit: step 10/40 (25 %)", "fit: step 20/40 (50 %)",
                     "fit: step 30/40 (75 %)", "fit: step 40/40 (100 %)"]  # fmt: skip


def test_fit_writes_progress_lines_when_its_output_is_a_file(tiny_dir, tmp_path):
    import json
    import os
    import subprocess
    import sys

    for name, who in (("forget", "Alice"), ("retain", "Bob")):
        rows = [{"prompt": f"Where was {who} born? ", "answer": "Springfield"}] * 4
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    base = tmp_path / "base.yaml"
    base.write_text(
        f"trainer:\n  max_steps: 3\nmodel:\n  init_args:\n    model_path: {tiny_dir}\n"
        f"data:\n  init_args:\n    tokenizer_path: {tiny_dir}\n    forget_path: {tmp_path / 'forget.jsonl'}\n"
        f"    retain_path: {tmp_path / 'retain.jsonl'}\n    batch_size: 2\n",
        encoding="utf-8",
    )
    log_file = tmp_path / "fit.log"
    with open(log_file, "w", encoding="utf-8") as out:  # not a terminal, as under SLURM or nohup
        code = subprocess.run(
            [sys.executable, "-m", "lightning_unlearn.cli", "fit", "-c", "lens/npo.yaml", "-c", str(base),
             "--trainer.default_root_dir", str(tmp_path / "run")],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300,
        ).returncode  # fmt: skip
    text = log_file.read_text(encoding="utf-8")
    assert code == 0, text[-2000:]
    assert "fit: training from step 0 to 3" in text
    assert "fit: step 3/3 (100 %) · epoch" in text and " · done" in text
