#!/usr/bin/env bash
# PET (Jeon et al., PLoS ONE 2023; user_dir/pet/README.md): compress a fairseq translation teacher into a
# 4+4-logical-layer student built from 2+2 physical layers, with stock fairseq commands.
#   1. warmup   fairseq-train --criterion pet_warmup: the simplified task (paper: 3 epochs)
#   2. kd       fairseq-train --criterion kd, from the warmed-up checkpoint (word-level KD)
#   3. measure  fc-measure: teacher vs student (BLEU, non-embedding parameters, size, sentences/s, memory)
# then the score line. Every stage is skipped once finished (WORK/STAGE/DONE); rerunning the same command
# resumes an interrupted one (fairseq's checkpoint_last.pt); a stage finished with other settings is refused.
#
#   bash scripts/recipes/pet.sh [WORK_DIR]                 (default: work/pet; the shipped Multi30k DE->EN
#                                                           teacher on the embedded Multi30k)
#   TEACHER=my_teacher.pt DATA=data-bin/my.fr-en ENC_DIM=320 DEC_DIM=240 bash scripts/recipes/pet.sh work/pet-my
#       any fairseq translation teacher and its data-bin (e.g. from python -m preprocess.prepare_parallel); the
#       languages are read off the data-bin's file names (or SRC=.. TGT=..)
#   the paper's Table 7 setting on a GPU (IWSLT'14 DE->EN; the teacher from scripts/recipes/train_teacher_iwslt14.sh;
#   fairseq's IWSLT schedule: lr 5e-4, dropout 0.3, 4,000 lr warm-up updates, 4,096 tokens a batch; WMT'17:
#   ARCH=pet_transformer_wmt LR=7e-4 DROPOUT=0.1 MAX_TOKENS=8192):
#   DEVICE_FLAGS=--fp16 ENC_DIM=320 DEC_DIM=240 LR=5e-4 DROPOUT=0.3 LR_WARMUP=4000 MAX_TOKENS=4096 \
#     TEACHER=work/teacher-iwslt14/checkpoints.de-en/averaged.pt DATA=work/teacher-iwslt14/data-bin.de-en \
#     bash scripts/recipes/pet.sh work/pet-iwslt14.de-en
#   SMOKE=1 bash scripts/recipes/pet.sh work/pet-smoke     2 + 3 updates, 20 test sentences (a pipeline check)
#   DRY_RUN=1 bash scripts/recipes/pet.sh                  print the commands only
#
# Variables (defaults in brackets):
#   ARCH [pet_transformer_iwslt]: the student's architecture (pet_transformer_wmt: the paper's WMT'17 student)
#   ENC_DIM, DEC_DIM  the student's encoder/decoder widths [128, 96]; FFN 2x, 4 heads (--arch pet_transformer_iwslt).
#                     The paper's (320, 240) are 62.5% / 47% of its 512-wide teacher; against the shipped 256-wide,
#                     3+3-layer teacher, 128/96 put the student under 10% of its non-embedding parameters (PET
#                     Table 7 compares at ~9.5%). Set them for your teacher.
#   WARMUP_EPOCHS [3]: the warm-up on the simplified task (the paper's 3 epochs; 0: no warm-up, PET Table 9);
#                     WARMUP_UPDATES bounds it by updates instead.
#   The KD stage follows the rule every translation student shares (scripts/recipes/common.sh, student_training):
#   PATIENCE [3] validations without a lower validation loss end it (the paper: until the model "stops improving on
#   the validation set over three epochs"; PATIENCE=0: never), VALIDATE_EVERY [1] epochs, at most MAX_EPOCHS [60];
#   KD_UPDATES=N trains exactly N updates instead (the demo). LR [1e-3], LR_WARMUP [500], MAX_TOKENS [2048],
#   DROPOUT [0.1], SEED [1]; TEACHER_CACHE: a cache of the teacher's outputs on the training set
#   (python -m user_dir.tools.teacher_cache), read instead of running the teacher; EXTRA (more fairseq-train flags),
#   DEVICE_FLAGS [--cpu].
#   RUNS [3]: timed runs of the measurement; MEASURE_TEACHER [1]: 0 scores the student alone (the grids: speed is
#   measured on its own, scripts/experiments/grid.py); MEASURE_EXTRA: more fc-measure flags; MEASURE_ALSO="name=path
#   ...": more checkpoints in the same table; REPORT [WORK_DIR/pet.md]: scripts/bench/pet_report.py's report.
# Last, WORK_DIR/result.json records the run (scripts/experiments/record.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin pet "$@"
ARCH="${ARCH:-pet_transformer_iwslt}"; WARMUP_EPOCHS="${WARMUP_EPOCHS:-3}"; ENC_DIM="${ENC_DIM:-128}"; DEC_DIM="${DEC_DIM:-96}"
RUNS="${RUNS:-3}"; MEASURE_TEACHER="${MEASURE_TEACHER:-1}"; MEASURE_EXTRA="${MEASURE_EXTRA:-}"
UPDATES="${KD_UPDATES:-}"
student_training
if [ "$SMOKE" = 1 ]; then
  WARMUP_UPDATES="${WARMUP_UPDATES:-2}"; RUNS=1; MAX_TOKENS=1024
  MEASURE_EXTRA="--max-sentences 20 ${SMOKE_DECODE[*]} $MEASURE_EXTRA"; student_training
fi
RECORD_VARS="ARCH ENC_DIM DEC_DIM WARMUP_EPOCHS WARMUP_UPDATES KD_UPDATES PATIENCE VALIDATE_EVERY MAX_EPOCHS LR LR_WARMUP MAX_TOKENS DROPOUT SEED EXTRA DEVICE_FLAGS"
WARMUP_BOUND=(--max-epoch "$WARMUP_EPOCHS")
[ -n "${WARMUP_UPDATES:-}" ] && WARMUP_BOUND=(--max-update "$WARMUP_UPDATES" --max-epoch 0)
shipped_translation_data
language_pair
say "teacher $TEACHER, data $DATA ($SRC->$TGT); student widths $ENC_DIM/$DEC_DIM, work $WORK"
CACHE=(); [ -n "${TEACHER_CACHE:-}" ] && CACHE=(--teacher-cache "$(absolute "$TEACHER_CACHE")")

STUDENT=(--user-dir "$ROOT/user_dir" --arch "$ARCH" --encoder-embed-dim "$ENC_DIM"
  --decoder-embed-dim "$DEC_DIM" --share-decoder-input-output-embed "${STUDENT_TRAINING[@]}"
  --source-lang "$SRC" --target-lang "$TGT" --teacher-path "$TEACHER" ${EXTRA:-})

START_FROM=(); TRAINED=()
if [ "$WARMUP_EPOCHS" -gt 0 ]; then
  say "1/3 warm-up on the simplified task (--criterion pet_warmup, ${WARMUP_BOUND[*]})"
  stage warmup fairseq-train "$DATA" "${STUDENT[@]}" --criterion pet_warmup "${WARMUP_BOUND[@]}" --save-dir "$WORK/warmup"
  START_FROM=(--finetune-from-model "$WORK/warmup/checkpoint_last.pt"); TRAINED=(warmup)
fi
say "2/3 word-level KD from the warmed-up student (--criterion kd, ${STOPPING[*]})"
stage kd fairseq-train "$DATA" "${STUDENT[@]}" --criterion kd --label-smoothing 0.1 --kd-alpha 0.5 --kd-temperature 1 \
  "${CACHE[@]}" "${STOPPING[@]}" "${START_FROM[@]}" --save-dir "$WORK/kd"

ALSO_PATHS=(); ALSO_NAMES=()
[ "$MEASURE_TEACHER" = 1 ] && ALSO_PATHS=("$TEACHER") && ALSO_NAMES=(teacher)
for ITEM in ${MEASURE_ALSO:-}; do
  [ -f "${ITEM#*=}" ] || die "MEASURE_ALSO item $ITEM: no checkpoint ${ITEM#*=}"
  ALSO_NAMES+=("${ITEM%%=*}"); ALSO_PATHS+=("${ITEM#*=}")
done
say "3/3 teacher vs PET: BLEU on test (beam 5), parameters, size, speed ($RUNS timed runs)"
stage measure "$PY" -m user_dir.tools.measure "$DATA" --path "${ALSO_PATHS[@]:0:1}" "$WORK/kd/checkpoint_best.pt" \
  "${ALSO_PATHS[@]:1}" --names "${ALSO_NAMES[@]:0:1}" pet "${ALSO_NAMES[@]:1}" "${RAW_REFERENCE[@]}" --beam 5 \
  --batch-size 128 --runs "$RUNS" "${TOOL_DEVICE[@]}" $MEASURE_EXTRA --out "$WORK/measure.md" --json "$WORK/measure.json" \
  --outputs-dir "$WORK/outputs"
[ "$DRY_RUN" = 1 ] && exit 0
# the teacher's row filed beside the student's where it was measured (the score line's "teacher")
RECORD_ALSO=""; [ "$MEASURE_TEACHER" = 1 ] && RECORD_ALSO=teacher
write_result pet "$WORK/kd/checkpoint_best.pt" "${SHIPPED_DATA_STAGE[@]}" "${TRAINED[@]}" kd measure -- "${TRAINED[@]}" kd

STAGES="WARMUP_EPOCHS=$WARMUP_EPOCHS"; WARMUP_LENGTH="$WARMUP_EPOCHS epochs"
[ -n "${WARMUP_UPDATES:-}" ] && STAGES="$STAGES WARMUP_UPDATES=$WARMUP_UPDATES" && WARMUP_LENGTH="$WARMUP_UPDATES updates"
if [ -n "${KD_UPDATES:-}" ]; then STAGES="$STAGES KD_UPDATES=$KD_UPDATES"; KD_LENGTH="$KD_UPDATES updates"
else STAGES="$STAGES PATIENCE=$PATIENCE MAX_EPOCHS=$MAX_EPOCHS"
  KD_LENGTH="epochs until the validation loss had not improved for $PATIENCE validations (at most $MAX_EPOCHS)"; fi
LENGTHS="$WARMUP_LENGTH|$KD_LENGTH"
[ "$MEASURE_TEACHER" = 1 ] && "$PY" "$ROOT/scripts/bench/pet_report.py" "$WORK" --out "${REPORT:-$WORK/pet.md}" \
  --command "$STAGES SEED=$SEED${EXTRA:+ EXTRA='$EXTRA'} bash scripts/recipes/pet.sh ${1:-}" \
  --recipe "$SRC->$TGT; ${LENGTHS%|*} of warm-up on the simplified task, then ${LENGTHS#*|} of word-level KD from the warmed-up checkpoint; seed $SEED; student widths $ENC_DIM/$DEC_DIM, 4+4 logical layers from 2+2 physical, pairs (1,3),(2,4), encoder Q<->K, decoder Q_self = Q_ed; scored at the checkpoint of best validation loss"
print_score
