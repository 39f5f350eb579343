#!/usr/bin/env bash
# The Lacuna testbed's built-in default, end to end on a CPU: pretrain a tiny θ_pre on the neutral corpus,
# inject synthetic PII with 5% group masks (and the UnMask control beside it), instruction-tune both with LoRA on
# the last two blocks, measure extraction per field and write the memorization-filtered splits.
# Prints a table of extraction rates (masked vs unmasked). Re-running reuses finished stages.
#
#   bash scripts/lacuna_default.sh                 # work directory runs/lacuna
#   bash scripts/lacuna_default.sh --workdir DIR   # any `lightning-unlearn lacuna run` option
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/lightning-unlearn ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q torch==2.13.0 -e .
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/lightning-unlearn lacuna run "$@"
