#!/usr/bin/env bash
# Localization precision on the Lacuna testbed (Lacuna Sec. 4.3, App. E): OracleGrad (gradient difference, every
# update restricted to the forget mask m^F) against unrestricted full-fine-tuning GA and SimNPO. Builds or reuses
# the testbed (`lightning-unlearn lacuna run`: pretrain → masked inject + UnMask control → instruct → filter), runs
# the three methods with `lightning-unlearn fit -c lacuna/{oracle_grad,ga,simnpo}.yaml` (GA and SimNPO also
# on the UnMask control, for the contrast families), scores each with `lightning-unlearn mask-auc` and prints the
# AUC(F) and AUC(F|R) table. Results: <workdir>/localization/summary.json.
#
#   bash scripts/lacuna_localization.sh                                 # testbed runs/lacuna (built if missing)
#   bash scripts/lacuna_localization.sh --workdir DIR --size tiny       # a tiny testbed (unfiltered splits)
#   bash scripts/lacuna_localization.sh --epochs 200 --field phone      # any `lacuna localization` option
#   bash scripts/lacuna_localization.sh --workdir runs/lacuna_smollm2 --model_path smollm2 \
#     --inject_config lacuna/inject_smollm2.yaml                # the SmolLM2 testbed (memorized splits)
# Options are `lightning-unlearn lacuna localization --help`'s (--batch_size, --control false, ...); --workdir,
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
nice "$cli" lacuna run --workdir "$workdir" --size "$size" "${chain[@]}"  # reuses every finished stage
exec nice "$cli" lacuna localization --workdir "$workdir" "${rest[@]}"
