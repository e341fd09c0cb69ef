#!/usr/bin/env bash
# The main demo: set up, prepare the embedded Multi30k DE->EN, train a teacher, compress it with
# PET (simplified-task warm-up, then word-level KD into a 4+4-logical-layer shared student), and
# print teacher vs PET through the measurement command: BLEU, non-embedding parameters and
# compression rate, size on disk, sentences/s, memory.
#
#   bash scripts/demo.sh           # ~30 minutes on 2 CPU cores, set-up included (short trainings)
#   bash scripts/demo.sh --full    # the full CPU-scale recipes (teacher ~1 h, PET 3+10 epochs ~2 h)
#
# Works on a fresh clone: the data it needs ship inside the repository (preprocess/data/).
# Outputs go to work/demo/ (data-bin, checkpoints, logs) and the table to work/demo/pet/measure.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FULL=0
[ "${1:-}" = "--full" ] && FULL=1
WORK="${WORK:-$ROOT/work/demo}"
DEMO_MINUTES="${DEMO_MINUTES:-9}"          # teacher training
PET_WARMUP_MINUTES="${PET_WARMUP_MINUTES:-2}"  # PET's simplified-task warm-up
PET_KD_MINUTES="${PET_KD_MINUTES:-7}"          # PET's word-level KD
say() { printf '\n=== [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

say "1/4 set-up (cached after the first time)"
bash scripts/setup_env.sh
source "${VENV:-$ROOT/.venv}/bin/activate"

say "2/4 data: embedded Multi30k DE->EN -> Moses tokens -> BPE -> fairseq binary"
python -m preprocess.prepare_multi30k --src de --tgt en --dest "$WORK/data-bin"

rm -rf "$WORK/checkpoints" "$WORK/pet"  # the demo always trains afresh (fairseq would otherwise resume an earlier run)
if [ "$FULL" = 1 ]; then
  say "3/4 training the full CPU-scale teacher (about an hour on 2 cores)"
  DATA="$WORK/data-bin" bash scripts/train_teacher_multi30k.sh "$WORK"
else
  say "3/4 training a teacher for ${DEMO_MINUTES} minutes (bash scripts/demo.sh --full for the full recipe)"
  # the reference teacher's recipe with 2+2 layers instead of 3+3, bigger batches, a shorter LR
  # warm-up and a time bound, so that a few minutes on 2 cores give a usable model
  hours=$(python -c "print(${DEMO_MINUTES} / 60)")
  DATA="$WORK/data-bin" STOP_HOURS="$hours" MAX_EPOCH=30 EXTRA="--encoder-layers 2 --decoder-layers 2 \
    --max-tokens 4096 --warmup-updates 200 --lr 1e-3 --log-interval 25" bash scripts/train_teacher_multi30k.sh "$WORK"
fi

say "4/4 compressing the teacher with PET (warm-up ${PET_WARMUP_MINUTES} min, then KD ${PET_KD_MINUTES} min), then teacher vs PET on test_2016_flickr (beam 5, 3 timed runs)"
TEACHER="$WORK/checkpoints/checkpoint_best.pt"
# outputs bounded at 1.2 x source length + 10 tokens, as fairseq's IWSLT recipe validates
if [ "$FULL" = 1 ]; then
  TEACHER="$TEACHER" DATA="$WORK/data-bin" MEASURE_EXTRA="--max-len-a 1.2 --max-len-b 10" \
    bash scripts/pet_multi30k.sh "$WORK/pet"
else
  # short stages: a shorter LR warm-up so a few hundred updates reach the peak learning rate
  TEACHER="$TEACHER" DATA="$WORK/data-bin" WARMUP_MINUTES="$PET_WARMUP_MINUTES" KD_MINUTES="$PET_KD_MINUTES" \
    WARMUP_EPOCHS=3 KD_EPOCHS=30 EXTRA="--warmup-updates 100 --log-interval 25" \
    MEASURE_EXTRA="--max-len-a 1.2 --max-len-b 10" bash scripts/pet_multi30k.sh "$WORK/pet"
fi
say "done: the table above is in $WORK/pet/measure.md"
