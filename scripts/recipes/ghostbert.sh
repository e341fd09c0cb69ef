#!/usr/bin/env bash
# GhostBERT (Huang et al.; user_dir/ghost/README.md): prune a teacher's encoder heads and FFN neurons by
# importance to width multiplier m, add softmax-normalised depthwise-convolution ghost modules, distil, fine-tune.
# A translation teacher (the encoder is pruned) or a GLUE encoder (hf_bert, e.g. from scripts/recipes/glue_teachers.sh):
#   1. prune     python -m user_dir.ghost.tools.prune: head/neuron importance on the dev set, rewiring, slicing,
#                ghost modules -> an ordinary checkpoint (section 2.3 "Pruning")
#   2. distill   fairseq-train --criterion ghost_distill: embedding + post-MHA + post-FFN MSE from the frozen
#                teacher (eq. 6; Table 8: lambda = 0, 1, 1)
#   3. finetune  fairseq-train with the task's cross-entropy (Table 8: lambda = 1, 0, 0)
#   4. measure   fc-measure: teacher vs the fine-tuned model (BLEU on test / the GLUE metric on REPORT_SUBSET [dev]), sizes, speed
# then the score line. Architecture flags come from the pruned checkpoint (fc-flags), a GLUE teacher's task
# flags (classes, [CLS], shortening, regression) from the teacher (fc-flags --task). Finished stages are
# skipped (WORK/STAGE/DONE), an interrupted training resumes, a stage finished with other settings is refused.
#
#   bash scripts/recipes/ghostbert.sh [WORK_DIR]           (default work/ghostbert: the shipped Multi30k teacher,
#                                                           m = 2/4, 200 + 60 updates)
#   TEACHER=rte_teacher.pt DATA=data-bin/RTE.wordpiece GLUE_TASK=RTE WIDTH=3/12 bash scripts/recipes/ghostbert.sh work/ghost-rte
#   VARIANT=pruned ...                                      pruned only (the same procedure without ghost modules)
#   SMOKE=1 ... / DRY_RUN=1 ...                             a tiny budget / print the commands only
#
# Variables (defaults in brackets; Table 8 is the paper's GLUE setting on a GPU):
#   WIDTH [1/2]: m, M = floor(N_H m) heads and M of N_H FFN folds kept per layer (e.g. 2/4, 6/12; 1: unpruned)
#   VARIANT [ghost]: ghost = --ghost-positions o,ffn2 (the paper's GhostBERT), pruned = --ghost-positions none;
#       GHOST_FLAGS adds ghost_prune flags (--ghost-kernel-size 5, --ghost-conv conv2d, ...: Tables 4-6, 9)
#   DISTILL_UPDATES, FINETUNE_UPDATES [translation 200, 60; GLUE 240, 240 = 3 RTE epochs at batch 32];
#       DISTILL_EPOCHS / FINETUNE_EPOCHS (GLUE) count them from the data instead (Table 8: 3 + 3; MNLI, QQP 1 + 3)
#   LR [translation 5e-4; GLUE 2e-5, Table 8], BATCH [GLUE 32, Table 8], MAX_TOKENS [translation 2048]
#   SEED [1], VALIDATIONS [GLUE 4: dev evaluations in the fine-tuning stage; the best is measured], EXTRA
#   (more fairseq-train flags), DEVICE_FLAGS [--cpu; --fp16 on a GPU], RUNS [1: timed measurement runs]
# The optimiser is Table 8's for both stages (GLUE): Adam (0.9, 0.999), eps 1e-6, no warm-up, linear decay to 0,
# weight decay 0, clipping 1, dropout and attention dropout 0.1; translation: scripts/bench/bench_ghost.py's (Adam (0.9,
# 0.98), no warm-up, linear decay to 0, clipping 1, dropout 0.1, weight decay 0, max-tokens batches). scripts/recipes/ghostbert_glue_gpu.sh runs the paper's Tables 1/3 on BERT-base.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin ghostbert "$@"
WIDTH="${WIDTH:-1/2}"; VARIANT="${VARIANT:-ghost}"; SEED="${SEED:-1}"; RUNS="${RUNS:-1}"
case "$VARIANT" in
  ghost) VARIANT_FLAGS=(--ghost-positions o,ffn2) ;;
  pruned) VARIANT_FLAGS=(--ghost-positions none) ;;
  *) die "VARIANT=$VARIANT: ghost or pruned" ;;
esac
glue_or_translation
PRUNE_EXTRA=(); MEASURE_EXTRA=(); SMOKE_TRAIN=()
if [ "$MODE" = glue ]; then
  DISTILL_UPDATES="${DISTILL_UPDATES:-240}"; FINETUNE_UPDATES="${FINETUNE_UPDATES:-240}"; LR="${LR:-2e-5}"
  BATCH="${BATCH:-32}"; VALIDATIONS="${VALIDATIONS:-4}"
  [ -n "${DISTILL_EPOCHS:-}" ] && updates_for DISTILL_UPDATES "$DATA" "$DISTILL_EPOCHS" "$BATCH"
  [ -n "${FINETUNE_EPOCHS:-}" ] && updates_for FINETUNE_UPDATES "$DATA" "$FINETUNE_EPOCHS" "$BATCH"
  PRUNE_EXTRA=(--batch-size "$BATCH"); BATCHING=(--batch-size "$BATCH"); BETAS='(0.9,0.999)'
  ADAM_EPS=(--adam-eps 1e-6); ATTENTION_DROPOUT=(--attention-dropout 0.1)
  MEASURE_EXTRA=(--glue-task "$GLUE_TASK" --gen-subset "$REPORT_SUBSET")
  FINETUNE_CRITERION=(--criterion glue_sentence_prediction --glue-task "$GLUE_TASK" --best-checkpoint-metric "$METRIC"
                      --maximize-best-checkpoint-metric)
else
  DISTILL_UPDATES="${DISTILL_UPDATES:-200}"; FINETUNE_UPDATES="${FINETUNE_UPDATES:-60}"; LR="${LR:-5e-4}"
  VALIDATIONS="${VALIDATIONS:-1}"; BATCHING=(--max-tokens "${MAX_TOKENS:-2048}"); BETAS='(0.9,0.98)'
  ADAM_EPS=(); ATTENTION_DROPOUT=()
  FINETUNE_CRITERION=(--criterion label_smoothed_cross_entropy --label-smoothing 0.1)
fi
if [ "$SMOKE" = 1 ]; then
  DISTILL_UPDATES=2; FINETUNE_UPDATES=2; VALIDATIONS=1; PRUNE_EXTRA+=(--max-batches 2); SMOKE_TRAIN=(--max-valid-steps 2)
  MEASURE_EXTRA+=(--max-sentences 20 "${SMOKE_DECODE[@]}")
fi
say "teacher $TEACHER ($MODE${GLUE_TASK:+ $GLUE_TASK}), data $DATA; m = $WIDTH, $VARIANT; $DISTILL_UPDATES distillation + $FINETUNE_UPDATES fine-tuning updates at lr $LR; work $WORK"

# Table 8 (GLUE) for both stages, bounded by updates; the translation analogue with max-tokens batches
optimiser() {  # optimiser VAR UPDATES
  local -n _opt="$1"
  _opt=(--optimizer adam --adam-betas "$BETAS" "${ADAM_EPS[@]}" --lr "$LR" --lr-scheduler polynomial_decay
        --total-num-update "$2" --warmup-updates 0 --end-learning-rate 0 --clip-norm 1 --dropout 0.1
        "${ATTENTION_DROPOUT[@]}" --weight-decay 0 --max-update "$2" --seed "$SEED")
}
optimiser DISTILL_OPT "$DISTILL_UPDATES"; optimiser FINETUNE_OPT "$FINETUNE_UPDATES"
COMMON=(--user-dir "$ROOT/user_dir" --log-format simple --log-interval 10 --no-epoch-checkpoints --num-workers 0
        "${BATCHING[@]}" $DEVICE_FLAGS "${SMOKE_TRAIN[@]}" ${EXTRA:-})
INIT="$WORK/prune/init.pt"

say "1/4 prune: importance on the dev set, keep m = $WIDTH of the heads and FFN folds, ${VARIANT_FLAGS[*]}"
stage prune "$PY" -m user_dir.ghost.tools.prune "$DATA" --path "$TEACHER" --width-mult "$WIDTH" "${VARIANT_FLAGS[@]}" \
  ${GHOST_FLAGS:-} --out "$INIT" --subset valid --seed "$SEED" "${PRUNE_EXTRA[@]}" "${TOOL_DEVICE[@]}"
flags_of ARCH "$INIT"
TASK=(); [ "$MODE" = glue ] && TASK=("${TASK_FLAGS[@]}")

say "2/4 distill: hidden states of the frozen teacher (--criterion ghost_distill), $DISTILL_UPDATES updates"
stage distill fairseq-train "$DATA" "${TASK[@]}" "${ARCH[@]}" "${COMMON[@]}" "${DISTILL_OPT[@]}" \
  --disable-validation --criterion ghost_distill --teacher-path "$TEACHER" --finetune-from-model "$INIT" --save-dir "$WORK/distill"

# fine-tuning validated VALIDATIONS times at equal intervals (the model measured is the best of them, as the
# paper's "best development set performance"; translation: the lowest validation loss)
interval EVERY "$FINETUNE_UPDATES" "$VALIDATIONS"
say "3/4 fine-tune with the task's loss (${FINETUNE_CRITERION[1]}), $FINETUNE_UPDATES updates, $VALIDATIONS validation(s)"
stage finetune fairseq-train "$DATA" "${TASK[@]}" "${ARCH[@]}" "${COMMON[@]}" "${FINETUNE_OPT[@]}" \
  "${FINETUNE_CRITERION[@]}" --finetune-from-model "$WORK/distill/checkpoint_last.pt" \
  --validate-interval-updates "$EVERY" --save-interval-updates "$EVERY" --validate-interval 1000000 \
  --keep-interval-updates 1 \
  --save-dir "$WORK/finetune"

say "4/4 teacher vs GhostBERT (m = $WIDTH, $VARIANT)"
stage measure "$PY" -m user_dir.tools.measure "$DATA" --path "$TEACHER" "$WORK/finetune/checkpoint_best.pt" \
  --names teacher "ghostbert-$VARIANT" --beam 5 --batch-size 64 --runs "$RUNS" "${MEASURE_EXTRA[@]}" "${MEASURE_DEVICE[@]}" \
  "${RAW_REFERENCE[@]}" --out "$WORK/measure.md" --json "$WORK/measure.json" --outputs-dir "$WORK/outputs"
[ "$DRY_RUN" = 1 ] && exit 0
RECORD_VARS="GLUE_TASK REPORT_SUBSET WIDTH VARIANT DISTILL_UPDATES FINETUNE_UPDATES DISTILL_EPOCHS FINETUNE_EPOCHS LR BATCH VALIDATIONS SEED EXTRA DEVICE_FLAGS"
# the teacher's row filed beside the student's, as apc.sh and variator.sh file it (the score line's "teacher")
RECORD_ALSO=teacher write_result "ghostbert-$VARIANT" "$WORK/finetune/checkpoint_best.pt" "${SHIPPED_DATA_STAGE[@]}" \
  prune distill finetune measure -- distill finetune
print_score
