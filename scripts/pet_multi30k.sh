#!/usr/bin/env bash
# PET on the CPU: compress a translation teacher with stock fairseq commands (default: the
# Multi30k DE->EN reference teacher on Multi30k DE->EN; any teacher and its data-bin with DATA/TEACHER).
#   teacher -> fairseq-train --criterion pet_warmup (WARMUP_EPOCHS, paper: 3)
#           -> fairseq-train --criterion kd, started from the warmed-up checkpoint (KD_EPOCHS, default 20:
#              the paper trains until validation stops improving; at 10 epochs ours was still improving
#              and 2.0 BLEU below the teacher, at 20 it is above it, results/pet_multi30k.md)
#           -> the measurement command: teacher vs PET (BLEU, parameters, size, sentences/s)
#
#   bash scripts/pet_multi30k.sh [WORK_DIR]                 (default: work/pet-multi30k)
#   TEACHER=path/to/teacher.pt bash scripts/pet_multi30k.sh  (default: the reference teacher in ../shared if
#                                     present, else the copy shipped in checkpoints/multi30k.de-en/, else
#                                     scripts/train_teacher_multi30k.sh's)
#   DATA=data-bin/my.de-en TEACHER=my_teacher.pt bash scripts/pet_multi30k.sh work/pet-my
#                                    (any fairseq data-bin, e.g. from python -m preprocess.prepare_parallel; the
#                                     languages are read off its file names, or SRC=.. TGT=..; default DATA:
#                                     WORK_DIR/data-bin, made from the embedded Multi30k DE->EN)
#   WARMUP_EPOCHS=0 KD_EPOCHS=... bash scripts/pet_multi30k.sh   (no warm-up, PET Table 9)
#   WARMUP_UPDATES=200 KD_UPDATES=600 bash scripts/pet_multi30k.sh   (stages bounded by updates instead of
#                                                                   epochs, as the demo runs it)
#   SEED=2 bash scripts/pet_multi30k.sh work/pet-seed2
#   EXTRA="--max-update 50" RUNS=1 bash scripts/pet_multi30k.sh work/pet-smoke   (a quick end-to-end check)
#   MEASURE_EXTRA="--max-len-a 1.2 --max-len-b 10" ...          (extra flags for the measurement command)
#   Re-running the same command resumes an interrupted run (fairseq's checkpoint_last.pt; logs are appended).
#   REPORT=results/pet_multi30k.md bash scripts/pet_multi30k.sh work/pet-full   (where scripts/pet_report.py's report goes;
#                                                                               default WORK_DIR/pet.md)
#   MEASURE_ALSO="name=path ..." ...                 (more checkpoints in the same measurement table, e.g. the
#                                                       shipped full-recipe student beside a short run's, as the demo does)
#   DEVICE_FLAGS= bash scripts/pet_multi30k.sh ...     (train on the GPU fairseq finds; default --cpu. The recipe is
#                                                       otherwise the same: fp32, --max-tokens 2048)
#
# Student dims: the paper's (320, 240) are 62.5% / 47% of its teacher's 512; against this 256-wide,
# 3+3-layer teacher we use (128, 96) with FFN 2x and 4 heads, which puts the 4+4-logical-layer
# student under 10% of the teacher's non-embedding parameters (PET Table 7 compares at ~9.5%).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${1:-$ROOT/work/pet-multi30k}"
REFERENCE="$ROOT/../shared/teachers/multi30k.de-en/teacher.pt"
SHIPPED="$ROOT/checkpoints/multi30k.de-en/teacher.pt"
if [ -z "${TEACHER:-}" ]; then
  for TEACHER in "$REFERENCE" "$SHIPPED" "$ROOT/work/teacher-multi30k/checkpoints/checkpoint_best.pt"; do
    [ -f "$TEACHER" ] && break
  done
fi
[ -f "$TEACHER" ] || { echo "pet_multi30k.sh: no teacher at $TEACHER (TEACHER=..., or run scripts/train_teacher_multi30k.sh)" >&2; exit 2; }
DATA="${DATA:-$WORK/data-bin}"
WARMUP_EPOCHS="${WARMUP_EPOCHS:-3}"; KD_EPOCHS="${KD_EPOCHS:-20}"; SEED="${SEED:-1}"
ENC_DIM="${ENC_DIM:-128}"; DEC_DIM="${DEC_DIM:-96}"; DEVICE_FLAGS="${DEVICE_FLAGS---cpu}"
mkdir -p "$WORK"
# a stage runs for its epochs, or for a fixed number of updates when *_UPDATES is set (the same
# result on every machine, unlike a time bound)
bound() { if [ -n "${2:-}" ]; then echo "--max-update $2 --max-epoch 0"; else echo "--max-epoch $1"; fi; }
WARMUP_BOUND=$(bound "$WARMUP_EPOCHS" "${WARMUP_UPDATES:-}")
KD_BOUND=$(bound "$KD_EPOCHS" "${KD_UPDATES:-}")

if ! ls "$DATA"/dict.*.txt >/dev/null 2>&1; then
  # no data-bin there yet: the default teacher's data (our pipeline reproduces its binarised files exactly)
  python -m preprocess.prepare_multi30k --src "${SRC:-de}" --tgt "${TGT:-en}" --dest "$DATA"
fi
if [ -z "${SRC:-}" ] || [ -z "${TGT:-}" ]; then  # the language pair from the data-bin's file names
  pair=$(cd "$DATA" && ls train.*-*.*.idx 2>/dev/null | head -1 | cut -d. -f2)
  [ -n "$pair" ] || { echo "pet_multi30k.sh: $DATA has no train.SRC-TGT.*.idx (a fairseq translation data-bin?)" >&2; exit 2; }
  SRC="${SRC:-${pair%-*}}"; TGT="${TGT:-${pair#*-}}"
fi
RAW_REFERENCE=()  # untokenised references for sacreBLEU, where the preparer kept them
[ -f "$DATA/text/test.raw.$TGT" ] && RAW_REFERENCE=(--raw-reference "$DATA/text/test.raw.$TGT")

STUDENT=(--user-dir "$ROOT/user_dir" --arch pet_transformer_iwslt --encoder-embed-dim "$ENC_DIM"
  --decoder-embed-dim "$DEC_DIM" --share-decoder-input-output-embed --dropout 0.1
  --optimizer adam --adam-betas '(0.9,0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 500
  --warmup-init-lr 1e-7 --weight-decay 1e-4 --max-tokens 2048 $DEVICE_FLAGS --seed "$SEED" --no-epoch-checkpoints
  --log-format simple --log-interval 50 --source-lang "$SRC" --target-lang "$TGT" --teacher-path "$TEACHER" ${EXTRA:-})

START_FROM=()
if [ "$WARMUP_EPOCHS" -gt 0 ]; then
  fairseq-train "$DATA" "${STUDENT[@]}" --criterion pet_warmup $WARMUP_BOUND \
    --save-dir "$WORK/warmup" 2>&1 | tee -a "$WORK/warmup.log"
  START_FROM=(--finetune-from-model "$WORK/warmup/checkpoint_last.pt")
fi
fairseq-train "$DATA" "${STUDENT[@]}" --criterion kd --label-smoothing 0.1 --kd-alpha 0.5 --kd-temperature 1 \
  $KD_BOUND "${START_FROM[@]}" --save-dir "$WORK/kd" 2>&1 | tee -a "$WORK/kd.log"

ALSO_PATHS=(); ALSO_NAMES=()
for ITEM in ${MEASURE_ALSO:-}; do
  [ -f "${ITEM#*=}" ] || { echo "pet_multi30k.sh: MEASURE_ALSO item $ITEM: no checkpoint ${ITEM#*=}" >&2; exit 2; }
  ALSO_NAMES+=("${ITEM%%=*}"); ALSO_PATHS+=("${ITEM#*=}")
done
python -m user_dir.tools.measure "$DATA" --path "$TEACHER" "$WORK/kd/checkpoint_best.pt" "${ALSO_PATHS[@]}" \
  --names teacher pet "${ALSO_NAMES[@]}" \
  "${RAW_REFERENCE[@]}" --beam 5 --batch-size 128 --runs "${RUNS:-3}" ${MEASURE_EXTRA:-} \
  --out "$WORK/measure.md" --json "$WORK/measure.json"

STAGES="WARMUP_EPOCHS=$WARMUP_EPOCHS KD_EPOCHS=$KD_EPOCHS"; LENGTHS="$WARMUP_EPOCHS epochs|$KD_EPOCHS epochs"
[ -n "${WARMUP_UPDATES:-}" ] && STAGES="$STAGES WARMUP_UPDATES=$WARMUP_UPDATES" && LENGTHS="$WARMUP_UPDATES updates|${LENGTHS#*|}"
[ -n "${KD_UPDATES:-}" ] && STAGES="$STAGES KD_UPDATES=$KD_UPDATES" && LENGTHS="${LENGTHS%|*}|$KD_UPDATES updates"
python "$ROOT/scripts/pet_report.py" "$WORK" --out "${REPORT:-$WORK/pet.md}" \
  --command "$STAGES SEED=$SEED${EXTRA:+ EXTRA='$EXTRA'} bash scripts/pet_multi30k.sh ${1:-}" \
  --recipe "$SRC->$TGT; ${LENGTHS%|*} of warm-up on the simplified task, then ${LENGTHS#*|} of word-level KD from the warmed-up checkpoint; seed $SEED; student widths $ENC_DIM/$DEC_DIM, 4+4 logical layers from 2+2 physical, pairs (1,3),(2,4), encoder Q<->K, decoder Q_self = Q_ed; scored at the checkpoint of best validation loss"
