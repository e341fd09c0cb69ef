#!/usr/bin/env bash
# The papers' IWSLT'14 DE->EN teacher on a GPU: fairseq's transformer_iwslt_de_en (6+6 layers,
# 512 dims, FFN 1024, 4 heads -- the PET paper's teacher) with fairseq's published IWSLT recipe
# (examples/translation/README.md), then the last 5 epoch checkpoints averaged, beam 5.
#
#   bash scripts/recipes/train_teacher_iwslt14.sh [WORK_DIR]     (default WORK_DIR: work/teacher-iwslt14)
#   SRC=en TGT=de bash scripts/recipes/train_teacher_iwslt14.sh  (the other direction)
#
# Needs the internet once (the IWSLT'14 archive) or RAW_DIR=<unpacked release>.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${1:-$ROOT/work/teacher-iwslt14}"
SRC="${SRC:-de}"; TGT="${TGT:-en}"
DATA="$WORK/data-bin.$SRC-$TGT"
MAX_EPOCH="${MAX_EPOCH:-50}"
mkdir -p "$WORK"

python -m preprocess.prepare_translation --corpus iwslt14.de-en --src "$SRC" --tgt "$TGT" --dest "$DATA" \
  --download-dir "$WORK/downloads" ${RAW_DIR:+--raw-dir "$RAW_DIR"}

start=$(date +%s)
fairseq-train "$DATA" --user-dir "$ROOT/user_dir" \
  --arch transformer_iwslt_de_en --share-decoder-input-output-embed \
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr 5e-4 --lr-scheduler inverse_sqrt \
  --warmup-updates 4000 --dropout 0.3 --weight-decay 0.0001 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 --max-epoch "$MAX_EPOCH" \
  --eval-bleu --eval-bleu-args '{"beam": 5, "max_len_a": 1.2, "max_len_b": 10}' --eval-bleu-detok moses \
  --eval-bleu-remove-bpe --best-checkpoint-metric bleu --maximize-best-checkpoint-metric \
  --save-dir "$WORK/checkpoints.$SRC-$TGT" --keep-last-epochs 5 --fp16 ${EXTRA:-} 2>&1 | tee "$WORK/train.$SRC-$TGT.log"
echo "training wall time: $(( $(date +%s) - start )) s" | tee -a "$WORK/train.$SRC-$TGT.log"

python -m user_dir.tools.average_checkpoints --inputs "$WORK/checkpoints.$SRC-$TGT" --num-epoch-checkpoints 5 \
  --output "$WORK/checkpoints.$SRC-$TGT/averaged.pt"
python -m user_dir.tools.measure "$DATA" --path "$WORK/checkpoints.$SRC-$TGT/averaged.pt" --names teacher \
  --batch-size 128 --out "$WORK/teacher.$SRC-$TGT.md" --json "$WORK/teacher.$SRC-$TGT.json"
