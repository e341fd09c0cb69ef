#!/usr/bin/env bash
# APC's GLUE result at the paper's scale on a GPU (APC paper, Table 2: APC-50-ff on BERT-base; Table 3's
# strategies), from a Hugging Face BERT-base directory:
#   1. teachers  BERT-base imported (user_dir/bert/tools/import_hf.py) and fine-tuned on each task by
#                scripts/recipes/glue_teachers.sh GPU=1 (512 positions, fp16; lr TEACHER_LRS, the best dev run kept),
#                or TEACHERS=a folder laid out as glue_teachers.sh leaves one
#   2. per task: scripts/recipes/apc.sh (init, compress, finalize, fine-tune, measure): APC-50-ff = every FFN but
#                the first two layers' 3072 -> 256 (0-based layers 2-11), neuron-pruning init (Table 1's best),
#                COMPRESS_UPDATES Compr.-only updates at step size 1e-4 with linear decay (section 4.3: 100), then
#                the 'Finalized' strategy the paper recommends (Table 3): batch 32, lr 2e-5, 100 warm-up updates,
#                linear decay, epochs MNLI 1, SST-2 8, MRPC 163, RTE 240 ("an approximately equal amount of steps
#                per dataset"), --fp16. STRATEGY=all-params trains the teacher's weights in the compression stage.
# Each task's run lives in WORK/TASK/ and ends with its score line; finished stages are skipped.
# The paper compresses during MLM pre-training; the imported encoders carry no MLM head, so the compression
# stage trains on the task (as scripts/bench/bench_apc_glue.py does at CPU scale).
#
#   HF_MODEL=models/bert-base-uncased GLUE_DIR=data/glue bash scripts/recipes/apc_glue_gpu.sh work/apc-gpu
#   DRY_RUN=1 HF_MODEL=... GLUE_DIR=... bash scripts/recipes/apc_glue_gpu.sh work/x      (print the commands)
#
# Variables (defaults in brackets): TASKS [RTE MRPC SST-2; also MNLI, or any GLUE task with FINETUNE_EPOCHS], FFN_DIMS
# [2:256,3:256,...,11:256: APC-50-ff], INIT [neuron-pruning], COMPRESS_UPDATES [100], TEACHER_LRS [2e-5],
# FINETUNE_LR [2e-5], BATCH [32], FINETUNE_EPOCHS [per task, above], STRATEGY [compr-only], SEED [1],
# DEVICE_FLAGS [--fp16].
set -euo pipefail
DEVICE_FLAGS="${DEVICE_FLAGS---fp16}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin apc-gpu "$@"
TASKS="${TASKS:-RTE MRPC SST-2}"; TEACHER_LRS="${TEACHER_LRS:-2e-5}"
FFN_DIMS="${FFN_DIMS:-2:256,3:256,4:256,5:256,6:256,7:256,8:256,9:256,10:256,11:256}"
bert_teachers
for TASK in $TASKS; do
  case "$TASK" in MNLI) EPOCHS=1 ;; SST-2) EPOCHS=8 ;; MRPC) EPOCHS=163 ;; RTE) EPOCHS=240 ;;
    *) [ -n "${FINETUNE_EPOCHS:-}" ] || die "$TASK: the paper trains MNLI, SST-2, MRPC, RTE; give FINETUNE_EPOCHS" ;;
  esac
  say "$TASK: APC-50-ff, ${STRATEGY:-compr-only} compression, then ${FINETUNE_EPOCHS:-$EPOCHS} epochs of the finalized model"
  TEACHER="$TEACHERS/$TASK/checkpoints/checkpoint_best.pt" DATA="$TEACHERS/data-bin/$TASK.wordpiece" GLUE_TASK="$TASK" \
    ENCODER_FFN_DIMS="$FFN_DIMS" INIT="${INIT:-neuron-pruning}" COMPRESS_UPDATES="${COMPRESS_UPDATES:-100}" \
    COMPRESS_LR=1e-4 STRATEGY="${STRATEGY:-compr-only}" FINETUNE_EPOCHS="${FINETUNE_EPOCHS:-$EPOCHS}" \
    FINETUNE_LR="${FINETUNE_LR:-2e-5}" WARMUP=100 BATCH="${BATCH:-32}" SEED="${SEED:-1}" DEVICE_FLAGS="$DEVICE_FLAGS" \
    bash "$ROOT/scripts/recipes/apc.sh" "$WORK/$TASK"
done
