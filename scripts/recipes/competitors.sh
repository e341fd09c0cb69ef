#!/usr/bin/env bash
# PET's competitors (user_dir/baselines/README.md): a student of PET's size trained from scratch by one of
#   KIND=word     word-level KD (Kim & Rush 2016; ours: PET's paper does not compare with it)
#   KIND=patient  Patient-KD (Sun et al. 2019): word-level KD + the distance of matched intermediate hidden states
#   KIND=can      CAN (Li et al., AAAI 2021; PET's reference [34]): compressed-attention decoder layers, word-level KD
#   KIND=seq      sequence-level KD (Kim & Rush 2016): the teacher's beam-5 translations of the training set as targets
# on the teacher's data, with the same training rule as PET's KD stage (scripts/recipes/common.sh, student_training:
# PATIENCE [3] validations without a lower validation loss end training, at most MAX_EPOCHS [60]; the best checkpoint
# is scored), then fc-measure on test (BLEU, sacreBLEU, non-embedding parameters) and WORK_DIR/result.json.
#
#   KIND=patient bash scripts/recipes/competitors.sh [WORK_DIR]     (default: work/competitor-KIND)
#   KIND=can TEACHER=my.pt DATA=data-bin/my.de-en bash scripts/recipes/competitors.sh work/can-my
#   SMOKE=1 KIND=word bash scripts/recipes/competitors.sh work/smoke   3 updates, 20 test sentences
#
# Variables (defaults in brackets):
#   KIND [word]; STUDENT_FLAGS: the student's architecture flags, default PET's size against the shipped teacher (the
#   widths of scripts/recipes/pet.sh's student; CAN: a 6-layer encoder and 2 compressed decoder layers, as CAN's
#   authors configure it: 12 + 2 layers, at width 64), each within 4% of PET's non-embedding parameters (PET Table 7 keeps its competitors within
#   about 4%; the counts: results/pet_sizes.md);
#   PKD_BETA [100]: Patient-KD's weight (user_dir/baselines/patient_kd_criterion.py); SEQKD_DATA: a data-bin made by
#   python -m user_dir.baselines.tools.seq_kd_data (default: made in WORK_DIR/seqkd-data);
#   TEACHER_CACHE: the teacher's outputs on the training set (python -m user_dir.tools.teacher_cache; word, can);
#   the training rule's LR, LR_WARMUP, MAX_TOKENS, DROPOUT, SEED, PATIENCE, VALIDATE_EVERY, MAX_EPOCHS, UPDATES;
#   EXTRA (more fairseq-train flags), DEVICE_FLAGS [--cpu]; RUNS [1] timed runs of the measurement.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
KIND="${KIND:-word}"
begin "competitor-$KIND" "$@"
RUNS="${RUNS:-1}"; MEASURE_EXTRA="${MEASURE_EXTRA:-}"
student_training
[ "$SMOKE" = 1 ] && MAX_TOKENS=1024 && MEASURE_EXTRA="--max-sentences 20 ${SMOKE_DECODE[*]} $MEASURE_EXTRA" && student_training
shipped_translation_data
language_pair

PLAIN="--arch transformer_iwslt_de_en --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 96 --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 192 --encoder-attention-heads 4 --decoder-attention-heads 4 --share-decoder-input-output-embed"
CAN="--arch can_transformer_iwslt --encoder-layers 12 --decoder-layers 2 --encoder-embed-dim 64 --decoder-embed-dim 64 --encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 --encoder-attention-heads 4 --decoder-attention-heads 4 --share-decoder-input-output-embed"
KD=(--label-smoothing 0.1 --kd-alpha 0.5 --kd-temperature 1 --teacher-path "$TEACHER")
CACHE=(); [ -n "${TEACHER_CACHE:-}" ] && CACHE=(--teacher-cache "$(absolute "$TEACHER_CACHE")")
TRAIN_DATA="$DATA"; DATA_STAGES=("${SHIPPED_DATA_STAGE[@]}")
case "$KIND" in
  word) ARCH="${STUDENT_FLAGS:-$PLAIN}"; CRITERION=(--criterion kd "${KD[@]}" "${CACHE[@]}") ;;
  patient) ARCH="${STUDENT_FLAGS:-$PLAIN}"; PKD_BETA="${PKD_BETA:-100}"
    [ -z "${TEACHER_CACHE:-}" ] || die "TEACHER_CACHE: Patient-KD also reads the teacher's hidden states, which the cache does not hold; run it without"
    CRITERION=(--criterion patient_kd "${KD[@]}" --pkd-beta "$PKD_BETA") ;;
  can) ARCH="${STUDENT_FLAGS:-$CAN}"; CRITERION=(--criterion kd "${KD[@]}" "${CACHE[@]}") ;;
  seq) ARCH="${STUDENT_FLAGS:-$PLAIN}"; CRITERION=(--criterion label_smoothed_cross_entropy --label-smoothing 0.1)
    if [ -n "${SEQKD_DATA:-}" ]; then TRAIN_DATA="$(absolute "$SEQKD_DATA")"
    else TRAIN_DATA="$WORK/seqkd-data"; DATA_STAGES+=(seqkd_data)
      say "the teacher's beam-5 translations of the training set (sequence-level KD's targets)"
      stage seqkd_data "$PY" -m user_dir.baselines.tools.seq_kd_data "$DATA" --path "$TEACHER" --dest "$TRAIN_DATA" \
        "${TOOL_DEVICE[@]}"
    fi ;;
  *) die "KIND=$KIND: one of word, patient, can, seq" ;;
esac
RECORD_VARS="KIND STUDENT_FLAGS PKD_BETA UPDATES PATIENCE VALIDATE_EVERY MAX_EPOCHS LR LR_WARMUP MAX_TOKENS DROPOUT SEED EXTRA DEVICE_FLAGS"
say "teacher $TEACHER, data $TRAIN_DATA ($SRC->$TGT); $KIND student ($ARCH), work $WORK"

say "1/2 train (${CRITERION[1]}, ${STOPPING[*]})"
# shellcheck disable=SC2086  # ARCH: a flag string
stage train fairseq-train "$TRAIN_DATA" --user-dir "$ROOT/user_dir" $ARCH "${STUDENT_TRAINING[@]}" --source-lang "$SRC" \
  --target-lang "$TGT" "${CRITERION[@]}" "${STOPPING[@]}" ${EXTRA:-} --save-dir "$WORK/train"
say "2/2 BLEU on test (beam 5), parameters"
stage measure "$PY" -m user_dir.tools.measure "$DATA" --path "$WORK/train/checkpoint_best.pt" --names "$KIND" \
  "${RAW_REFERENCE[@]}" --beam 5 --batch-size 128 --runs "$RUNS" "${TOOL_DEVICE[@]}" $MEASURE_EXTRA \
  --out "$WORK/measure.md" --json "$WORK/measure.json" --outputs-dir "$WORK/outputs"
[ "$DRY_RUN" = 1 ] && exit 0
write_result "$KIND" "$WORK/train/checkpoint_best.pt" "${DATA_STAGES[@]}" train measure -- train
print_score
