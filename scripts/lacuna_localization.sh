#!/usr/bin/env bash
# Lacuna's findings on the built-in testbed (Lacuna Sec. 4.3, App. E-F): OracleGrad (gradient difference, every
# update restricted to the forget mask m^F), GA, SimNPO, MemFlex and AlphaEdit, on every PII field. Builds or reuses
# the testbed with its UnMask control (`lightning-unlearn lacuna run --control true`), then
# `lightning-unlearn lacuna localization`: each method unlearns each field with `lightning-unlearn fit -c
# lacuna/<method>.yaml` (and again on the UnMask control, for the contrast families), the library's callbacks score
# forget / retain / paraphrase EM, ES, Prob, extraction and utility, `mask-auc` scores the weight change, and the
# resurfacing attack relearns on the held-out split and samples K continuations per forget prompt.
# Writes <workdir>/localization/{summary.json,report.md,report.png} and prints the report.
#
#   bash scripts/lacuna_localization.sh                                 # testbed runs/lacuna (built if missing)
#   bash scripts/lacuna_localization.sh --epoch_scale 0.25 --fields '[email]'   # any `lacuna localization` option
#   bash scripts/lacuna_localization.sh --workdir DIR --size tiny       # a tiny testbed (unfiltered splits)
#   bash scripts/lacuna_localization.sh --workdir runs/lacuna_smollm2 --model_path smollm2 \
#     --inject_config lacuna/inject_smollm2.yaml                # the SmolLM2 testbed
# Options are `lightning-unlearn lacuna localization --help`'s (--k, --parallel, --control false, ...); --workdir,
# --size, --model_path, --inject_config and --instruct_config (each overlay one file, repeatable) say how the
# testbed is built (`lacuna run`). The old dashed spellings (--model-path, --inject-config) still work here.
set -euo pipefail
cd "$(dirname "$0")/.."
workdir=runs/lacuna
size=default
chain=()  # `lacuna run` options that say how the testbed was built
rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    --workdir) workdir="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --model_path|--model-path) chain+=(--model_path "$2"); shift 2 ;;
    --inject_config|--inject-config) chain+=(--inject_config+ "$2"); shift 2 ;;  # one more overlay
    --instruct_config|--instruct-config) chain+=(--instruct_config+ "$2"); shift 2 ;;
    *) rest+=("$1"); shift ;;
  esac
done
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cli=.venv/bin/lightning-unlearn
nice "$cli" lacuna run --workdir "$workdir" --size "$size" --control true "${chain[@]}"  # reuses finished stages
exec nice "$cli" lacuna localization --workdir "$workdir" "${rest[@]}"
