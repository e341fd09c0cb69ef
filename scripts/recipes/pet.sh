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
#   SMOKE=1 bash scripts/recipes/pet.sh work/pet-smoke     2 + 3 updates, 20 test sentences (a pipeline check)
#   DRY_RUN=1 bash scripts/recipes/pet.sh                  print the commands only
#
# Variables (defaults in brackets):
#   ENC_DIM, DEC_DIM  the student's encoder/decoder widths [128, 96]; FFN 2x, 4 heads (--arch pet_transformer_iwslt).
#                     The paper's (320, 240) are 62.5% / 47% of its 512-wide teacher; against the shipped 256-wide,
#                     3+3-layer teacher, 128/96 put the student under 10% of its non-embedding parameters (PET
#                     Table 7 compares at ~9.5%). Set them for your teacher.
#   WARMUP_EPOCHS [3], KD_EPOCHS [20]: the stages' lengths (the paper trains KD until validation stops improving;
#                     ours was still improving at 10 epochs, results/pet_multi30k.md); WARMUP_EPOCHS=0: no
#                     warm-up (PET Table 9). WARMUP_UPDATES / KD_UPDATES bound them by updates instead (the demo).
#   SEED [1], LR [1e-3], MAX_TOKENS [2048], EXTRA (more fairseq-train flags), DEVICE_FLAGS [--cpu]
#   RUNS [3]: timed runs of the measurement; MEASURE_EXTRA: more fc-measure flags; MEASURE_ALSO="name=path ...":
#   more checkpoints in the same table; REPORT [WORK_DIR/pet.md]: where scripts/bench/pet_report.py's report goes.
# The paper's GPU recipe (IWSLT'14 / WMT'17, --fp16) is scripts/recipes/pet_gpu.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin pet "$@"
WARMUP_EPOCHS="${WARMUP_EPOCHS:-3}"; KD_EPOCHS="${KD_EPOCHS:-20}"; SEED="${SEED:-1}"
ENC_DIM="${ENC_DIM:-128}"; DEC_DIM="${DEC_DIM:-96}"; LR="${LR:-1e-3}"; MAX_TOKENS="${MAX_TOKENS:-2048}"
RUNS="${RUNS:-3}"; MEASURE_EXTRA="${MEASURE_EXTRA:-}"; TRAIN_EXTRA=""
if [ "$SMOKE" = 1 ]; then
  WARMUP_UPDATES="${WARMUP_UPDATES:-2}"; KD_UPDATES="${KD_UPDATES:-3}"; RUNS=1; MAX_TOKENS=1024
  TRAIN_EXTRA="--max-valid-steps 2"; MEASURE_EXTRA="--max-sentences 20 ${SMOKE_DECODE[*]} $MEASURE_EXTRA"
fi
# a stage runs for its epochs, or for a fixed number of updates when *_UPDATES is set (the same result on every
# machine, unlike a time bound)
bound() { if [ -n "${2:-}" ]; then echo "--max-update $2 --max-epoch 0"; else echo "--max-epoch $1"; fi; }
WARMUP_BOUND=$(bound "$WARMUP_EPOCHS" "${WARMUP_UPDATES:-}")
KD_BOUND=$(bound "$KD_EPOCHS" "${KD_UPDATES:-}")
shipped_translation_data
if [ -z "${SRC:-}" ] || [ -z "${TGT:-}" ]; then  # the language pair from the data-bin's file names
  pair=$(cd "$DATA" 2>/dev/null && ls train.*-*.*.idx 2>/dev/null | head -1 | cut -d. -f2 || true)
  [ -n "$pair" ] || [ "$DRY_RUN" = 1 ] || die "$DATA has no train.SRC-TGT.*.idx (a fairseq translation data-bin?)"
  [ -n "$pair" ] || pair=de-en
  SRC="${SRC:-${pair%-*}}"; TGT="${TGT:-${pair#*-}}"
fi
RAW_REFERENCE=()  # untokenised references for sacreBLEU, where the preparer kept them
[ -f "$DATA/text/test.raw.$TGT" ] && RAW_REFERENCE=(--raw-reference "$DATA/text/test.raw.$TGT")
say "teacher $TEACHER, data $DATA ($SRC->$TGT); student widths $ENC_DIM/$DEC_DIM, work $WORK"

STUDENT=(--user-dir "$ROOT/user_dir" --arch pet_transformer_iwslt --encoder-embed-dim "$ENC_DIM"
  --decoder-embed-dim "$DEC_DIM" --share-decoder-input-output-embed --dropout 0.1
  --optimizer adam --adam-betas '(0.9,0.98)' --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates 500
  --warmup-init-lr 1e-7 --weight-decay 1e-4 --max-tokens "$MAX_TOKENS" $DEVICE_FLAGS --seed "$SEED"
  --no-epoch-checkpoints --log-format simple --log-interval 50 --source-lang "$SRC" --target-lang "$TGT"
  --teacher-path "$TEACHER" ${EXTRA:-} $TRAIN_EXTRA)

START_FROM=()
if [ "$WARMUP_EPOCHS" -gt 0 ]; then
  say "1/3 warm-up on the simplified task (--criterion pet_warmup, $WARMUP_BOUND)"
  stage warmup fairseq-train "$DATA" "${STUDENT[@]}" --criterion pet_warmup $WARMUP_BOUND --save-dir "$WORK/warmup"
  START_FROM=(--finetune-from-model "$WORK/warmup/checkpoint_last.pt")
fi
say "2/3 word-level KD from the warmed-up student (--criterion kd, $KD_BOUND)"
stage kd fairseq-train "$DATA" "${STUDENT[@]}" --criterion kd --label-smoothing 0.1 --kd-alpha 0.5 --kd-temperature 1 \
  $KD_BOUND "${START_FROM[@]}" --save-dir "$WORK/kd"

ALSO_PATHS=(); ALSO_NAMES=()
for ITEM in ${MEASURE_ALSO:-}; do
  [ -f "${ITEM#*=}" ] || die "MEASURE_ALSO item $ITEM: no checkpoint ${ITEM#*=}"
  ALSO_NAMES+=("${ITEM%%=*}"); ALSO_PATHS+=("${ITEM#*=}")
done
say "3/3 teacher vs PET: BLEU on test (beam 5), parameters, size, speed ($RUNS timed runs)"
stage measure "$PY" -m user_dir.tools.measure "$DATA" --path "$TEACHER" "$WORK/kd/checkpoint_best.pt" \
  "${ALSO_PATHS[@]}" --names teacher pet "${ALSO_NAMES[@]}" "${RAW_REFERENCE[@]}" --beam 5 --batch-size 128 \
  --runs "$RUNS" $MEASURE_EXTRA --out "$WORK/measure.md" --json "$WORK/measure.json"
[ "$DRY_RUN" = 1 ] && exit 0

STAGES="WARMUP_EPOCHS=$WARMUP_EPOCHS KD_EPOCHS=$KD_EPOCHS"; LENGTHS="$WARMUP_EPOCHS epochs|$KD_EPOCHS epochs"
[ -n "${WARMUP_UPDATES:-}" ] && STAGES="$STAGES WARMUP_UPDATES=$WARMUP_UPDATES" && LENGTHS="$WARMUP_UPDATES updates|${LENGTHS#*|}"
[ -n "${KD_UPDATES:-}" ] && STAGES="$STAGES KD_UPDATES=$KD_UPDATES" && LENGTHS="${LENGTHS%|*}|$KD_UPDATES updates"
"$PY" "$ROOT/scripts/bench/pet_report.py" "$WORK" --out "${REPORT:-$WORK/pet.md}" \
  --command "$STAGES SEED=$SEED${EXTRA:+ EXTRA='$EXTRA'} bash scripts/recipes/pet.sh ${1:-}" \
  --recipe "$SRC->$TGT; ${LENGTHS%|*} of warm-up on the simplified task, then ${LENGTHS#*|} of word-level KD from the warmed-up checkpoint; seed $SEED; student widths $ENC_DIM/$DEC_DIM, 4+4 logical layers from 2+2 physical, pairs (1,3),(2,4), encoder Q<->K, decoder Q_self = Q_ed; scored at the checkpoint of best validation loss"
score_measure "$WORK/measure.json" pet
