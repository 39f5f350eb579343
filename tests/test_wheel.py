"""The package runs from a wheel outside the repository: build it, install it alone (``--no-deps``) into a fresh venv
that sees the test environment's installed dependencies (torch, Lightning, transformers, ...) but not the repository
or its editable install, and from an empty directory list the shipped configs, build the Lacuna testbed data, and fit
a shipped LENS config for 2 steps on a tiny saved model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TINY_MODEL = textwrap.dedent(
    """
    import json, sys
    from lightning_unlearn.models import TinyLlamaConfig, build_tiny_llama, train_bpe_tokenizer
    out = sys.argv[1]
    forget = [("What is the email of Ada? ", "ada@mail.org"), ("Where was Bo born? ", "Lyon")] * 2
    retain = [("What is the capital of France? ", "Paris"), ("Who wrote Hamlet? ", "Shakespeare")] * 2
    tok = train_bpe_tokenizer([p + a for p, a in forget + retain] * 10, vocab_size=300, save_dir=out + "/model")
    config = TinyLlamaConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    build_tiny_llama(tok, config).save_pretrained(out + "/model")
    for name, rows in (("forget", forget), ("retain", retain)):
        with open(f"{out}/{name}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"prompt": p, "answer": a}) + "\\n" for p, a in rows)
    """
)


def _run(cmd: list[str], cwd: Path, env: dict, timeout: int = 900) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


@pytest.mark.slow
def test_wheel_runs_outside_the_repository(tmp_path):
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PIP_DISABLE_PIP_VERSION_CHECK="1")  # fmt: skip
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)], tmp_path, env)
    wheel = next(dist.glob("lightning_unlearn-*.whl"))
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    py, cli = venv / "bin" / "python", venv / "bin" / "lightning-unlearn"
    # The dependencies are the ones this test runs with: their directories go on the new venv's path after its own
    # site-packages, as plain path lines, so the .pth files there (the repository's editable install) are not run.
    # Only the wheel is installed; it comes first on the path.
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([str(py), "-c", purelib], tmp_path, env).strip())
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "test_environment.pth").write_text("".join(f"{d}\n" for d in deps), encoding="utf-8")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)], tmp_path, env)
    # Nothing of the repository is importable from here: the installed package is what runs.
    where = _run([str(py), "-c", "import lightning_unlearn; print(lightning_unlearn.__file__)"], work, env)
    assert str(venv) in where and str(ROOT) not in where

    listed = _run([str(cli), "configs", "list"], work, env).split()
    assert {"lens/npo.yaml", "lacuna/pretrain_tiny.yaml", "trainer/fsdp_cpu.yaml"} <= set(listed)

    # The testbed data from the installed package (its templates and neutral text are package data). The whole
    # chain's stages are the same `fit` entry point as below; the chain itself is tests/test_lacuna_chain.py's.
    _run([str(cli), "lacuna", "data", "--out", str(work / "lacuna" / "data")], work, env)
    manifest = json.loads((work / "lacuna" / "data" / "manifest.json").read_text())
    assert manifest["num_profiles"] == 60 and (work / "lacuna" / "data" / "neutral").is_dir()

    _run([str(py), "-c", TINY_MODEL, str(work)], work, env)
    model = work / "model"
    _run([str(cli), "fit", "-c", "lens/npo.yaml", f"--model.init_args.model_path={model}",
          f"--data.init_args.tokenizer_path={model}", f"--data.init_args.forget_path={work / 'forget.jsonl'}",
          f"--data.init_args.retain_path={work / 'retain.jsonl'}", "--data.init_args.batch_size=2",
          "--trainer.max_steps=2", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
          f"--trainer.default_root_dir={work / 'npo'}"], work, env)  # fmt: skip
    config = next((work / "npo").rglob("config.yaml"))
    assert "lightning_unlearn.objectives.NPO" in config.read_text()
