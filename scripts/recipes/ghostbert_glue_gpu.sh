#!/usr/bin/env bash
# GhostBERT's GLUE results at the paper's scale on a GPU (Huang et al., Table 1: GhostBERT at every width
# multiplier m; Table 3 / Table 10: pruned only with the same procedure), from a Hugging Face BERT-base directory:
#   1. teachers  BERT-base imported (user_dir/bert/tools/import_hf.py) and fine-tuned on each task by
#                scripts/recipes/glue_teachers.sh GPU=1 (512 positions, fp16; lr TEACHER_LRS, the best dev run kept),
#                or TEACHERS=a folder laid out as glue_teachers.sh leaves one (e.g. RoBERTa-base teachers)
#   2. per task, m and variant: scripts/recipes/ghostbert.sh (prune, distill, fine-tune, measure) with Table 8:
#                batch 32, lr 2e-5, Adam (0.9, 0.999), no warm-up, linear decay, weight decay 0, clipping 1,
#                dropout 0.1, 3 epochs of distillation (1 for MNLI and QQP) and 3 of fine-tuning, --fp16; the
#                model measured is the fine-tuning checkpoint with the best dev score (VALIDATIONS evaluations)
# Each run lives in WORK/TASK/m<M>of<N>-<variant>/ and ends with its score line; finished stages are skipped.
#
#   HF_MODEL=models/bert-base-uncased GLUE_DIR=data/glue bash scripts/recipes/ghostbert_glue_gpu.sh work/ghostbert-gpu
#   TASKS="RTE MRPC" WIDTHS="6/12 3/12" VARIANTS="ghost pruned" HF_MODEL=... GLUE_DIR=... bash ... work/x
#   DRY_RUN=1 HF_MODEL=... GLUE_DIR=... bash scripts/recipes/ghostbert_glue_gpu.sh work/x    (print the commands)
#
# Variables (defaults in brackets): TASKS [RTE MRPC SST-2: the tasks with data here; any GLUE task, each with
# its recipe in scripts/recipes/glue_teachers.sh], WIDTHS [12/12 9/12 6/12 3/12 1/12: Table 1's rows], VARIANTS [ghost], TEACHER_LRS
# [2e-5], LR [2e-5], BATCH [32], DISTILL_EPOCHS / FINETUNE_EPOCHS [Table 8], VALIDATIONS [3], SEED [1],
# DEVICE_FLAGS [--fp16], GHOST_FLAGS (ablations: Tables 4-6, 9).
set -euo pipefail
DEVICE_FLAGS="${DEVICE_FLAGS---fp16}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin ghostbert-gpu "$@"
TASKS="${TASKS:-RTE MRPC SST-2}"; WIDTHS="${WIDTHS:-12/12 9/12 6/12 3/12 1/12}"; VARIANTS="${VARIANTS:-ghost}"
TEACHER_LRS="${TEACHER_LRS:-2e-5}"
bert_teachers
for TASK in $TASKS; do
  case "$TASK" in MNLI|QQP) DISTILL=1 ;; *) DISTILL=3 ;; esac  # Table 8's epochs
  for M in $WIDTHS; do
    for VARIANT in $VARIANTS; do
      say "$TASK, m = $M, $VARIANT"
      TEACHER="$TEACHERS/$TASK/checkpoints/checkpoint_best.pt" DATA="$TEACHERS/data-bin/$TASK.wordpiece" \
        GLUE_TASK="$TASK" WIDTH="$M" VARIANT="$VARIANT" LR="${LR:-2e-5}" BATCH="${BATCH:-32}" \
        DISTILL_EPOCHS="${DISTILL_EPOCHS:-$DISTILL}" FINETUNE_EPOCHS="${FINETUNE_EPOCHS:-3}" \
        VALIDATIONS="${VALIDATIONS:-3}" SEED="${SEED:-1}" DEVICE_FLAGS="$DEVICE_FLAGS" \
        bash "$ROOT/scripts/recipes/ghostbert.sh" "$WORK/$TASK/m${M/\//of}-$VARIANT"
    done
  done
done
