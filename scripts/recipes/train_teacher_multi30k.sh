#!/usr/bin/env bash
# CPU-scale teacher: Transformer on Multi30k DE->EN (or any DATA=data-bin), about an hour on 2 CPU cores.
# The recipe of the project's reference teacher (shared/teachers/multi30k.de-en): same data
# preparation (byte-identical binarised data), same flags; it trained 8 epochs in 57 minutes.
#
#   bash scripts/recipes/train_teacher_multi30k.sh [WORK_DIR]        (default WORK_DIR: work/teacher-multi30k)
#   MAX_EPOCH=30 STOP_HOURS=0.95 bash scripts/recipes/train_teacher_multi30k.sh   (the reference's bounds)
#   EXTRA="--max-update 300" bash scripts/recipes/train_teacher_multi30k.sh       (a short run)
#   DATA=data-bin/my.de-en bash scripts/recipes/train_teacher_multi30k.sh work/teacher-my   (any translation data-bin)
# The reference teacher itself ships in checkpoints/multi30k.de-en/ (no need to train one for the demo).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${1:-$ROOT/work/teacher-multi30k}"
DATA="${DATA:-$WORK/data-bin}"
MAX_EPOCH="${MAX_EPOCH:-8}"
STOP_HOURS="${STOP_HOURS:-0}"
SEED="${SEED:-1}"
mkdir -p "$WORK"

# DATA=an existing data-bin (e.g. from python -m preprocess.prepare_parallel) is used as it is; the
# languages are read off its file names by fairseq-train
ls "$DATA"/dict.*.txt >/dev/null 2>&1 || python -m preprocess.prepare_multi30k --src de --tgt en --dest "$DATA"

start=$(date +%s)
fairseq-train "$DATA" --user-dir "$ROOT/user_dir" \
  --arch transformer_iwslt_de_en --encoder-layers 3 --decoder-layers 3 \
  --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 \
  --encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings \
  --optimizer adam --adam-betas '(0.9,0.98)' --lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 500 \
  --warmup-init-lr 1e-7 --dropout 0.3 --weight-decay 1e-4 --criterion label_smoothed_cross_entropy \
  --label-smoothing 0.1 --max-tokens 2048 --max-epoch "$MAX_EPOCH" --stop-time-hours "$STOP_HOURS" \
  --cpu --seed "$SEED" --save-dir "$WORK/checkpoints" --no-epoch-checkpoints \
  --log-format simple --log-interval 50 ${EXTRA:-} 2>&1 | tee "$WORK/train.log"
echo "training wall time: $(( $(date +%s) - start )) s" | tee -a "$WORK/train.log"
