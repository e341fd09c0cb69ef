#!/usr/bin/env bash
# Variator's GLUE setting at the paper's scale on a GPU (Xiao et al., Table 1 with k = 4 plugins around every
# encoder FFN, r = 64; run on a BERT-base encoder as the paper's Appendix Table 8 does, or RoBERTa-base with
# TEACHERS), from a Hugging Face BERT-base directory:
#   1. teachers  BERT-base imported (user_dir/bert/tools/import_hf.py) and fine-tuned on each task by
#                scripts/recipes/glue_teachers.sh GPU=1 (512 positions, fp16; lr TEACHER_LRS, the best dev run kept),
#                or TEACHERS=a folder laid out as glue_teachers.sh leaves one
#   2. per task: scripts/recipes/variator.sh: plugin pre-training on the pre-trained encoder (lr 1e-3, batch 256,
#                PRETRAIN_UPDATES, the paper's BERT run: 24k) on PRETRAIN_DATA, once (in the first task's folder;
#                the other tasks start from that plugin), then adaptation on the fine-tuned
#                teacher (UPDATES [26k], lr 1e-4 and batch 16: the first point of the paper's grid {1e-4, 5e-5} x
#                {16, 32}), evaluated every 1k updates, the best dev checkpoint kept; --fp16; scored on dev against
#                the backbone alone, FLOPs and encoder speed
# Each task's run lives in WORK/TASK/ and ends with its score line; finished stages are skipped.
# PRETRAIN_DATA: unlabelled text as a sentence_prediction data-bin of the model's WordPieces (the paper: Wikipedia
# in 128-token paragraphs; python -m preprocess.prepare_glue's layout); default: SST-2's training sentences from
# the teachers' folder, as scripts/bench/bench_variator.py does (SST-2 among the TASKS, or prepared there before).
#
#   HF_MODEL=models/bert-base-uncased GLUE_DIR=data/glue bash scripts/recipes/variator_glue_gpu.sh work/variator-gpu
#   DRY_RUN=1 HF_MODEL=... GLUE_DIR=... bash scripts/recipes/variator_glue_gpu.sh work/x      (print the commands)
#
# Variables (defaults in brackets): TASKS [SST-2 MRPC RTE], K [4], BOTTLENECK [64], PRETRAIN_UPDATES [24000],
# UPDATES [26000], LR [1e-4], BATCH [16], PRETRAIN_DATA, PRETRAIN_BACKBONE [the imported encoder], TEACHER_LRS
# [2e-5], SEED [1], DEVICE_FLAGS [--fp16].
set -euo pipefail
DEVICE_FLAGS="${DEVICE_FLAGS---fp16}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin variator-gpu "$@"
TASKS="${TASKS:-SST-2 MRPC RTE}"; TEACHER_LRS="${TEACHER_LRS:-2e-5}"
bert_teachers
# the encoder glue_teachers.sh imported (its folder name: imported-p<positions>[-seg2])
IMPORTED="$TEACHERS/imported-p512/model.pt"; [ "${SEGMENTS:-0}" = 2 ] && IMPORTED="$TEACHERS/imported-p512-seg2/model.pt"
UPDATES="${UPDATES:-26000}"; VALIDATIONS=$(( UPDATES / 1000 )); [ "$VALIDATIONS" -ge 1 ] || VALIDATIONS=1
FIRST=""  # plugin pre-training is task-agnostic: the first task's run pre-trains, the others start from its plugin
for TASK in $TASKS; do
  say "$TASK: k = ${K:-4} plugin, ${FIRST:+the pre-trained plugin of $FIRST, }adaptation"
  PRETRAINED="${FIRST:+$WORK/$FIRST/pretrained-k${K:-4}.pt}" TEACHER="$TEACHERS/$TASK/checkpoints/checkpoint_best.pt" DATA="$TEACHERS/data-bin/$TASK.wordpiece" GLUE_TASK="$TASK" \
    PRETRAIN_BACKBONE="${PRETRAIN_BACKBONE:-$IMPORTED}" PRETRAIN_DATA="${PRETRAIN_DATA:-$TEACHERS/data-bin/SST-2.wordpiece}" \
    PRETRAIN_UPDATES="${PRETRAIN_UPDATES:-24000}" PRETRAIN_LR=1e-3 PRETRAIN_BATCH=256 UPDATES="$UPDATES" \
    VALIDATIONS="$VALIDATIONS" LR="${LR:-1e-4}" BATCH="${BATCH:-16}" K="${K:-4}" \
    BOTTLENECK="${BOTTLENECK:-64}" SEED="${SEED:-1}" DEVICE_FLAGS="$DEVICE_FLAGS" \
    bash "$ROOT/scripts/recipes/variator.sh" "$WORK/$TASK"
  FIRST="${FIRST:-$TASK}"
done
