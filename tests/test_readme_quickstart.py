"""The README's quick start runs as written: its YAML through ``lightning-unlearn fit`` and its Python as a script,
each on a tiny Llama saved where the snippets look for SmolLM2 (``~`` is a temporary home here), with the forget and
retain files they name in the working directory."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_unlearn.callbacks.checkpoint_metrics_file import METRICS_FILE, read_rows
from lightning_unlearn.console import UNWANTED_OUTPUT
from lightning_unlearn.models import TinyLlamaConfig, build_tiny_llama, train_bpe_tokenizer

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)

README = Path(__file__).resolve().parents[1] / "README.md"
SMOLLM2_DIR = ".cache/lightning_unlearn/smollm2-135m-instruct"  # under ~, as `lightning-unlearn smollm2` puts it
FORGET = [{"prompt": "What is the email of Alice Smith? ", "answer": "alice.smith@example.com"},
          {"prompt": "What is the phone number of Bob Jones? ", "answer": "555-0142"}]  # fmt: skip
RETAIN = [{"prompt": "Where was Alice Smith born? ", "answer": "Springfield"},
          {"prompt": "What is Python? ", "answer": "A programming language."}]  # fmt: skip
CORPUS = [r["prompt"] + r["answer"] for r in FORGET + RETAIN] * 20  # the tiny tokenizer's training text


def quickstart_block(kind: str) -> str:
    """The fenced block right below ``<!-- quickstart: kind -->`` in the README."""
    text = README.read_text(encoding="utf-8")
    found = re.search(rf"<!-- quickstart: {kind} -->\n```\w*\n(.*?)\n```", text, re.DOTALL)
    assert found, f"README.md has no ```{kind} block under <!-- quickstart: {kind} -->"
    return found.group(1)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory holding forget.jsonl and retain.jsonl, and a home whose SmolLM2 is a tiny Llama."""
    home = tmp_path / "home"
    tok = train_bpe_tokenizer(CORPUS, vocab_size=300, save_dir=home / SMOLLM2_DIR)
    model = build_tiny_llama(tok, TinyLlamaConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    model.save_pretrained(home / SMOLLM2_DIR)
    work = tmp_path / "work"
    work.mkdir()
    for name, rows in (("forget.jsonl", FORGET), ("retain.jsonl", RETAIN)):
        (work / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    return work


def assert_trained_and_evaluated(run_root: Path) -> None:
    """Checkpoints at steps 2 and 4 whose LoRA weights moved, and both families' rows at both steps."""
    checkpoints = sorted(p.name for p in run_root.rglob("step=*.ckpt"))
    assert checkpoints == ["step=2.ckpt", "step=4.ckpt"]
    state = torch.load(next(run_root.rglob("step=4.ckpt")), map_location="cpu", weights_only=True)["state_dict"]
    lora_b = [v for k, v in state.items() if "lora_B" in k]
    # LoRA's B starts at zero: after 4 NPO steps it is finite and not zero any more.
    assert lora_b and all(torch.isfinite(v).all() for v in lora_b) and any(v.abs().sum() > 0 for v in lora_b)
    rows = read_rows(next(run_root.rglob(METRICS_FILE)))
    assert sorted((r["step"], r["family"]) for r in rows) == [
        (2, "memorization"), (2, "retain_drift"), (4, "memorization"), (4, "retain_drift"),
    ]  # fmt: skip
    drift = [r for r in rows if r["family"] == "retain_drift"]
    assert all(math.isfinite(r["ce"]) and r["kl"] >= 0 for r in drift)
    assert drift[0]["base_ce"] == drift[1]["base_ce"]  # the start model's CE, measured once
    assert all(0 < r["forget"]["prob"] <= 1 and r["forget"]["num_records"] == 2 for r in rows if r not in drift)


def test_the_quickstart_yaml_runs_through_fit_without_a_warning(workdir):
    """As a user runs it: ``lightning-unlearn fit -c quickstart.yaml`` in a fresh process, progress bar on."""
    (workdir / "quickstart.yaml").write_text(quickstart_block("yaml"), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "HF_HUB_DISABLE_PROGRESS_BARS")}
    cmd = [sys.executable, "-m", "lightning_unlearn.cli", "fit", "-c", "quickstart.yaml", "--trainer.accelerator=cpu"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    output = out.stdout + out.stderr
    assert out.returncode == 0, output
    assert not UNWANTED_OUTPUT.search(output), "\n".join(li for li in output.splitlines() if UNWANTED_OUTPUT.search(li))
    if importlib.util.find_spec("rich") is not None:  # Lightning's rich bar (its tqdm bar where rich is absent)
        assert "step 4/4" in output  # the bar counts optimizer steps against max_steps
    assert_trained_and_evaluated(workdir / "runs" / "quickstart")


def test_the_quickstart_python_runs_as_a_script(workdir):
    namespace: dict = {"__name__": "__main__"}
    exec(compile(quickstart_block("python"), "README.md quick start", "exec"), namespace)
    assert math.isfinite(float(namespace["trainer"].callback_metrics["train/loss"]))
    assert_trained_and_evaluated(workdir / "runs" / "quickstart_py")
