#!/usr/bin/env bash
# PET with the paper's recipe on a GPU (Jeon et al. 2023, "Training details"): fairseq's default
# training configuration, warm-up on the simplified task for 3 epochs, then word-level KD from the
# warmed-up checkpoint until validation stops improving for 3 epochs (--patience 3), beam 5.
#
#   TEACHER=work/teacher-iwslt14/checkpoints.de-en/averaged.pt DATA=work/teacher-iwslt14/data-bin.de-en \
#     bash scripts/pet_gpu.sh work/pet-iwslt14.de-en                       # IWSLT'14, student pet_transformer_iwslt
#   ARCH=pet_transformer_wmt TEACHER=... DATA=... bash scripts/pet_gpu.sh work/pet-wmt17.lv-en   # WMT'17
#
# The teacher comes from scripts/train_teacher_iwslt14.sh (or any fairseq checkpoint trained on DATA).
# Student dims follow the arch: (320, 240) when the target is English, (240, 320) when the source is.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${1:?usage: TEACHER=... DATA=... bash scripts/pet_gpu.sh WORK_DIR}"
: "${TEACHER:?set TEACHER to the teacher checkpoint}"; : "${DATA:?set DATA to the teacher's data-bin}"
ARCH="${ARCH:-pet_transformer_iwslt}"; SEED="${SEED:-1}"; WARMUP_EPOCHS="${WARMUP_EPOCHS:-3}"
if [ "$ARCH" = pet_transformer_wmt ]; then
  OPT=(--lr 7e-4 --warmup-updates 4000 --max-tokens 8192 --dropout 0.1)   # Transformer-base (Vaswani et al.)
else
  OPT=(--lr 5e-4 --warmup-updates 4000 --max-tokens 4096 --dropout 0.3)   # fairseq's IWSLT recipe
fi
mkdir -p "$WORK"
COMMON=(--user-dir "$ROOT/user_dir" --arch "$ARCH" --share-decoder-input-output-embed --optimizer adam
  --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr-scheduler inverse_sqrt --weight-decay 0.0001 "${OPT[@]}"
  --teacher-path "$TEACHER" --seed "$SEED" --fp16 --log-format simple --log-interval 100 ${EXTRA:-})

START_FROM=()
if [ "$WARMUP_EPOCHS" -gt 0 ]; then
  fairseq-train "$DATA" "${COMMON[@]}" --criterion pet_warmup --max-epoch "$WARMUP_EPOCHS" \
    --save-dir "$WORK/warmup" --no-epoch-checkpoints 2>&1 | tee "$WORK/warmup.log"
  START_FROM=(--finetune-from-model "$WORK/warmup/checkpoint_last.pt")
fi
fairseq-train "$DATA" "${COMMON[@]}" --criterion kd --label-smoothing 0.1 "${START_FROM[@]}" --patience 3 \
  --eval-bleu --eval-bleu-args '{"beam": 5, "max_len_a": 1.2, "max_len_b": 10}' --eval-bleu-detok moses \
  --eval-bleu-remove-bpe --best-checkpoint-metric bleu --maximize-best-checkpoint-metric \
  --save-dir "$WORK/kd" --no-epoch-checkpoints 2>&1 | tee "$WORK/kd.log"

python -m user_dir.tools.measure "$DATA" --path "$TEACHER" "$WORK/kd/checkpoint_best.pt" --names teacher pet \
  --beam 5 --batch-size 128 --runs 3 --out "$WORK/measure.md" --json "$WORK/measure.json"
