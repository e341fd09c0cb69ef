#!/usr/bin/env bash
# APC, adaptive parameter compression (user_dir/apc/README.md): every compressed linear layer W becomes
# U W D + B around the frozen W, initialised from the teacher, trained, then folded into a smaller dense layer.
# A translation teacher (fairseq transformer) or a GLUE encoder (hf_bert, e.g. from scripts/recipes/glue_teachers.sh):
#   1. init      python -m user_dir.apc.tools.init: FFN (and attention / embedding) widths, an initialisation
#                (section 4.2; default neuron pruning, the paper's best in Table 1) -> an apc_* checkpoint
#   2. compress  fairseq-train from it, 'Compr. only' (only U, D, B, b_U, b_D train; Table 3), cross-entropy
#                (section 4.3's choice), the paper's step size 1e-4 with linear decay
#   3. finalize  python -m user_dir.apc.tools.finalize: U W D + B folded into dense layers (a stock transformer /
#                hf_bert when every layer of a side has one width)
#   4. finetune  (FINETUNE_UPDATES > 0) the 'Finalized' strategy of Table 3: every weight of the finalized model
#                fine-tuned (the paper recommends it), lr 2e-5, 100 warm-up updates, linear decay
#   5. measure   fc-measure: teacher vs the compressed model (BLEU on test / the GLUE metric on REPORT_SUBSET [dev]), sizes, speed
# then the score line. Architecture flags are read from each checkpoint with fc-flags, a GLUE teacher's task
# flags with fc-flags --task. Finished stages are skipped (WORK/STAGE/DONE), interrupted training resumes, a
# stage finished with other settings is refused.
#
#   bash scripts/recipes/apc.sh [WORK_DIR]        (default work/apc: the shipped Multi30k teacher, every FFN
#                                                  1024 -> 128, 300 compression updates)
#   TEACHER=rte_teacher.pt DATA=data-bin/RTE.wordpiece GLUE_TASK=RTE ENCODER_FFN_DIMS=1:128,2:128,3:128,4:128,5:128 \
#     FINETUNE_UPDATES=240 bash scripts/recipes/apc.sh work/apc-rte     (the APC-50-ff analogue of a 6-layer encoder)
#   SMOKE=1 ... / DRY_RUN=1 ...                   a tiny budget / print the commands only
#
# Variables (defaults in brackets):
#   ENCODER_FFN_DIMS, DECODER_FFN_DIMS [128 and 128 for translation; GLUE: required]: cmp^f, one size or
#       LAYER:SIZE pairs (0-based); ENCODER_ATTN_DIMS, DECODER_ATTN_DIMS, CROSS_ATTN_DIMS (cmp^a, a multiple of
#       the heads), ENCODER_EMBED_DIMS, DECODER_EMBED_DIMS (cmp^e): attention and embedding compression
#   VARIANT [apc]: pruning -- the control of neuron pruning + fine-tuning (the neuron-pruning init folded untrained,
#       then every weight fine-tuned for the updates APC trains in all, COMPRESS_UPDATES + FINETUNE_UPDATES, at
#       FINETUNE_LR; ours: the paper compares with pruning methods' reported scores); teacher -- the teacher itself
#       fine-tuned as long (is APC's gain the extra updates?; ours)
#   INIT [neuron-pruning]: random, reconstructive-random, reconstructive-svd, neuron-pruning, kmeans
#   COMPRESS_UPDATES [300], COMPRESS_LR [1e-4: the paper's step size], STRATEGY [compr-only; all-params: the
#       teacher's weights train too, --apc-train-original]; CRITERION [ce; kd: word-level KD from the teacher,
#       0.7 CE + 0.3 soft targets; act-kd: activation KD (translation)]
#   FINETUNE_UPDATES [0] / FINETUNE_EPOCHS (GLUE, counted from the data), FINETUNE_LR [2e-5], WARMUP [100]
#   BATCH [GLUE 32], MAX_TOKENS [translation 2048], SEED [1], EXTRA (more fairseq-train flags),
#   DEVICE_FLAGS [--cpu; --fp16 on a GPU], RUNS [1: timed measurement runs]
# scripts/recipes/apc_glue_gpu.sh runs the paper's Table 2 (APC-50-ff on BERT-base).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin apc "$@"
INIT_METHOD="${INIT:-neuron-pruning}"; SEED="${SEED:-1}"; RUNS="${RUNS:-1}"; VARIANT="${VARIANT:-apc}"
ROW=apc; [ "$VARIANT" = pruning ] && ROW=pruning-ft; [ "$VARIANT" = teacher ] && ROW=teacher-ft
COMPRESS_UPDATES="${COMPRESS_UPDATES:-300}"; COMPRESS_LR="${COMPRESS_LR:-1e-4}"
FINETUNE_UPDATES="${FINETUNE_UPDATES:-0}"; FINETUNE_LR="${FINETUNE_LR:-2e-5}"; WARMUP="${WARMUP:-100}"
glue_or_translation
DIMS=()
if [ "$MODE" = glue ]; then
  [ -n "${ENCODER_FFN_DIMS:-}${ENCODER_ATTN_DIMS:-}${ENCODER_EMBED_DIMS:-}" ] ||
    die "ENCODER_FFN_DIMS=... (e.g. 1:128,2:128 for layers 2-3; APC-50-ff on BERT-base: 2:256,...,11:256)"
  BATCH="${BATCH:-32}"; BATCHING=(--batch-size "$BATCH"); TASK=("${TASK_FLAGS[@]}")
  [ -n "${FINETUNE_EPOCHS:-}" ] && updates_for FINETUNE_UPDATES "$DATA" "$FINETUNE_EPOCHS" "$BATCH"
  CE=(--criterion glue_sentence_prediction --glue-task "$GLUE_TASK")
  SELECT=(--best-checkpoint-metric "$METRIC" --maximize-best-checkpoint-metric)
  MEASURE_EXTRA=(--glue-task "$GLUE_TASK" --gen-subset "$REPORT_SUBSET")
else
  ENCODER_FFN_DIMS="${ENCODER_FFN_DIMS-128}"; DECODER_FFN_DIMS="${DECODER_FFN_DIMS-128}"
  BATCHING=(--max-tokens "${MAX_TOKENS:-2048}"); TASK=(); SELECT=(); MEASURE_EXTRA=()
  CE=(--criterion label_smoothed_cross_entropy --label-smoothing 0)
fi
for NAME in ENCODER_FFN DECODER_FFN ENCODER_ATTN DECODER_ATTN CROSS_ATTN ENCODER_EMBED DECODER_EMBED; do
  VAR="${NAME}_DIMS"; OPTION="--$(echo "$NAME" | tr 'A-Z_' 'a-z-')-dims"
  [ -n "${!VAR:-}" ] && DIMS+=("$OPTION" "${!VAR}")
done
case "${CRITERION:-ce}" in
  ce) LOSS=("${CE[@]}") ;;
  kd) LOSS=(--criterion kd --teacher-path "$TEACHER" --kd-alpha 0.3 --kd-temperature 1 --label-smoothing 0) ;;
  act-kd) LOSS=(--criterion apc_activation_kd) ;;
  *) die "CRITERION=$CRITERION: ce, kd or act-kd" ;;
esac
STRATEGY_FLAGS=()
case "${STRATEGY:-compr-only}" in
  compr-only) ;;
  all-params) STRATEGY_FLAGS=(--apc-train-original) ;;
  *) die "STRATEGY=$STRATEGY: compr-only or all-params (Finalized: FINETUNE_UPDATES > 0)" ;;
esac
INIT_EXTRA=(); SMOKE_TRAIN=()
if [ "$SMOKE" = 1 ]; then
  COMPRESS_UPDATES=2; [ "$FINETUNE_UPDATES" -gt 0 ] 2>/dev/null && FINETUNE_UPDATES=2; WARMUP=1
  INIT_EXTRA=(--samples 200 --importance-batches 2); SMOKE_TRAIN=(--max-valid-steps 2)
  MEASURE_EXTRA+=(--max-sentences 20 "${SMOKE_DECODE[@]}")
fi
say "teacher $TEACHER ($MODE${GLUE_TASK:+ $GLUE_TASK}), data $DATA; ${DIMS[*]}, --init $INIT_METHOD; $COMPRESS_UPDATES compression updates (${STRATEGY:-compr-only}, ${CRITERION:-ce}), $FINETUNE_UPDATES fine-tuning updates; work $WORK"
COMMON=(--user-dir "$ROOT/user_dir" --log-format simple --log-interval 10 --no-epoch-checkpoints --num-workers 0
        --dropout 0.1 --seed "$SEED" "${BATCHING[@]}" $DEVICE_FLAGS "${SMOKE_TRAIN[@]}" ${EXTRA:-})

case "$VARIANT" in
  apc|pruning) ;;
  teacher) ;;
  *) die "VARIANT=$VARIANT: apc, pruning (neuron pruning + fine-tuning) or teacher (the teacher fine-tuned as long)" ;;
esac
[ "$VARIANT" = apc ] || { FINETUNE_UPDATES=$(( COMPRESS_UPDATES + FINETUNE_UPDATES )); COMPRESS_UPDATES=0; }
[ "$VARIANT" = pruning ] && [ "$INIT_METHOD" != neuron-pruning ] && die "VARIANT=pruning prunes neurons: INIT=neuron-pruning"
MODEL="$TEACHER"; STAGES=(); TRAINED=()
if [ "$VARIANT" != teacher ]; then
  say "1/5 init: the teacher's weights + U, D from --init $INIT_METHOD"
  stage init "$PY" -m user_dir.apc.tools.init "$TEACHER" --data "$DATA" "${DIMS[@]}" --init "$INIT_METHOD" \
    --seed "$SEED" "${INIT_EXTRA[@]}" --out "$WORK/init/init.pt"
  flags_of ARCH "$WORK/init/init.pt"
  FOLD_FROM="$WORK/init/init.pt"; STAGES=(init)
  if [ "$VARIANT" = apc ]; then
    say "2/5 compress: $COMPRESS_UPDATES updates at lr $COMPRESS_LR, linear decay (${LOSS[1]})"
    stage compress fairseq-train "$DATA" "${TASK[@]}" "${ARCH[@]}" "${STRATEGY_FLAGS[@]}" "${COMMON[@]}" "${LOSS[@]}" \
      --optimizer adam --adam-betas '(0.9,0.98)' --lr "$COMPRESS_LR" --lr-scheduler polynomial_decay \
      --total-num-update "$COMPRESS_UPDATES" --end-learning-rate 0 --max-update "$COMPRESS_UPDATES" \
      --finetune-from-model "$WORK/init/init.pt" "${SELECT[@]}" --save-dir "$WORK/compress"
    FOLD_FROM="$WORK/compress/checkpoint_last.pt"; STAGES+=(compress); TRAINED=(compress)
  else
    say "2/5 no compression training: the pruned neurons are folded untrained (the neuron-pruning control)"
  fi
  say "3/5 finalize: fold U W D + B into dense layers"
  stage finalize "$PY" -m user_dir.apc.tools.finalize "$FOLD_FROM" --out "$WORK/finalize/apc.pt"
  MODEL="$WORK/finalize/apc.pt"; STAGES+=(finalize)
else
  say "1-3/5 no compression: the teacher itself is fine-tuned as long as APC trains (the extra-updates control)"
fi

if [ "$FINETUNE_UPDATES" != 0 ]; then
  flags_of FINAL_ARCH "$MODEL"
  say "4/5 fine-tune the finalized model ('Finalized', Table 3): $FINETUNE_UPDATES updates at lr $FINETUNE_LR"
  stage finetune fairseq-train "$DATA" "${TASK[@]}" "${FINAL_ARCH[@]}" "${COMMON[@]}" "${CE[@]}" \
    --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-6 --lr "$FINETUNE_LR" --lr-scheduler polynomial_decay \
    --total-num-update "$FINETUNE_UPDATES" --warmup-updates "$WARMUP" --end-learning-rate 0 \
    --max-update "$FINETUNE_UPDATES" --finetune-from-model "$MODEL" "${SELECT[@]}" --save-dir "$WORK/finetune"
  MODEL="$WORK/finetune/checkpoint_last.pt"; STAGES+=(finetune); TRAINED+=(finetune)
else
  say "4/5 no fine-tuning of the finalized model (FINETUNE_UPDATES=0)"
fi

say "5/5 teacher vs APC"
stage measure "$PY" -m user_dir.tools.measure "$DATA" --path "$TEACHER" "$MODEL" --names teacher "$ROW" --beam 5 \
  --batch-size 64 --runs "$RUNS" "${MEASURE_EXTRA[@]}" "${MEASURE_DEVICE[@]}" --out "$WORK/measure.md" \
  --json "$WORK/measure.json" "${RAW_REFERENCE[@]}" --outputs-dir "$WORK/outputs"
[ "$DRY_RUN" = 1 ] && exit 0
RECORD_VARS="VARIANT GLUE_TASK REPORT_SUBSET ENCODER_FFN_DIMS DECODER_FFN_DIMS ENCODER_ATTN_DIMS ENCODER_EMBED_DIMS INIT_METHOD STRATEGY CRITERION COMPRESS_UPDATES COMPRESS_LR FINETUNE_UPDATES FINETUNE_EPOCHS FINETUNE_LR BATCH SEED EXTRA DEVICE_FLAGS"
RECORD_ALSO=teacher write_result "$ROW" "$MODEL" "${SHIPPED_DATA_STAGE[@]}" "${STAGES[@]}" measure -- "${TRAINED[@]}"
print_score
