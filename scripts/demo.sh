#!/usr/bin/env bash
# The main demo: set up, prepare the embedded Multi30k DE->EN, train a teacher, and report it
# through the measurement command (BLEU, parameters, size, sentences/s, memory).
#
#   bash scripts/demo.sh           # ~20 minutes on 2 CPU cores, set-up included (short training)
#   bash scripts/demo.sh --full    # the full CPU-scale teacher recipe (about an hour of training)
#
# Works on a fresh clone: the data it needs ship inside the repository (preprocess/data/).
# Outputs go to work/demo/ (data-bin, checkpoints, logs) and the table to work/demo/teacher.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FULL=0
[ "${1:-}" = "--full" ] && FULL=1
WORK="${WORK:-$ROOT/work/demo}"
DEMO_MINUTES="${DEMO_MINUTES:-9}"
say() { printf '\n=== [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

say "1/4 set-up (cached after the first time)"
bash scripts/setup_env.sh
source "${VENV:-$ROOT/.venv}/bin/activate"

say "2/4 data: embedded Multi30k DE->EN -> Moses tokens -> BPE -> fairseq binary"
python -m preprocess.prepare_multi30k --src de --tgt en --dest "$WORK/data-bin"

rm -rf "$WORK/checkpoints"  # the demo always trains afresh (fairseq would otherwise resume an earlier run)
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

say "4/4 measuring the teacher on test_2016_flickr (beam 5, 3 timed runs)"
# outputs bounded at 1.2 x source length + 10 tokens, as fairseq's IWSLT recipe validates
python -m user_dir.tools.measure "$WORK/data-bin" --path "$WORK/checkpoints/checkpoint_best.pt" --names teacher \
  --max-len-a 1.2 --max-len-b 10 --raw-reference "$WORK/data-bin/text/test.raw.en" --out "$WORK/teacher.md" --json "$WORK/teacher.json"
say "done: the table above is in $WORK/teacher.md"
