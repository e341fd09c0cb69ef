#!/usr/bin/env bash
# PET with the paper's recipe on a GPU (Jeon et al. 2023, "Training details"; Table 7): fairseq's default
# training configuration in half precision, warm-up on the simplified task for 3 epochs, then word-level KD from
# the warmed-up checkpoint until validation BLEU stops improving for 3 epochs (--patience 3), beam 5.
#   1. warmup   fairseq-train --criterion pet_warmup --max-epoch 3
#   2. kd       fairseq-train --criterion kd --patience 3, the best checkpoint by validation BLEU (beam 5)
#   3. measure  fc-measure: teacher vs PET (BLEU on test, beam 5; parameters; sentences/s; memory)
# Finished stages are skipped (WORK/STAGE/DONE); an interrupted one resumes from its checkpoint_last.pt.
#
#   TEACHER=work/teacher-iwslt14/checkpoints.de-en/averaged.pt DATA=work/teacher-iwslt14/data-bin.de-en \
#     bash scripts/recipes/pet_gpu.sh work/pet-iwslt14.de-en                  # IWSLT'14, student pet_transformer_iwslt
#   ARCH=pet_transformer_wmt TEACHER=... DATA=... bash scripts/recipes/pet_gpu.sh work/pet-wmt17.lv-en   # WMT'17
#   DRY_RUN=1 TEACHER=... DATA=... bash scripts/recipes/pet_gpu.sh work/x  # print the commands only
#
# The teacher comes from scripts/train_teacher_iwslt14.sh (or any fairseq checkpoint trained on DATA; the data
# from python -m preprocess.prepare_translation). Student dims follow the arch: (320, 240) when the target is
# English, (240, 320) when the source is. Variables: ARCH [pet_transformer_iwslt], SEED [1], WARMUP_EPOCHS [3],
# DEVICE_FLAGS [--fp16], EXTRA (more fairseq-train flags). The CPU recipe is scripts/recipes/pet.sh.
set -euo pipefail
DEVICE_FLAGS="${DEVICE_FLAGS---fp16}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
case "${1:-}" in -h|--help) begin pet-gpu "$@" ;; "") die "usage: TEACHER=... DATA=... bash $0 WORK_DIR (--help)" ;; esac
[ -n "${TEACHER:-}" ] && [ -n "${DATA:-}" ] || die "set TEACHER (the teacher checkpoint) and DATA (its data-bin)"
begin pet-gpu "$@"
ARCH="${ARCH:-pet_transformer_iwslt}"; SEED="${SEED:-1}"; WARMUP_EPOCHS="${WARMUP_EPOCHS:-3}"
if [ "$ARCH" = pet_transformer_wmt ]; then
  OPT=(--lr 7e-4 --warmup-updates 4000 --max-tokens 8192 --dropout 0.1)   # Transformer-base (Vaswani et al.)
else
  OPT=(--lr 5e-4 --warmup-updates 4000 --max-tokens 4096 --dropout 0.3)   # fairseq's IWSLT recipe
fi
say "teacher $TEACHER, data $DATA, student --arch $ARCH, work $WORK"
COMMON=(--user-dir "$ROOT/user_dir" --arch "$ARCH" --share-decoder-input-output-embed --optimizer adam
  --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr-scheduler inverse_sqrt --weight-decay 0.0001 "${OPT[@]}"
  --teacher-path "$TEACHER" --seed "$SEED" $DEVICE_FLAGS --log-format simple --log-interval 100 ${EXTRA:-})

START_FROM=()
if [ "$WARMUP_EPOCHS" -gt 0 ]; then
  say "1/3 warm-up on the simplified task, $WARMUP_EPOCHS epochs"
  stage warmup fairseq-train "$DATA" "${COMMON[@]}" --criterion pet_warmup --max-epoch "$WARMUP_EPOCHS" \
    --save-dir "$WORK/warmup" --no-epoch-checkpoints
  START_FROM=(--finetune-from-model "$WORK/warmup/checkpoint_last.pt")
fi
say "2/3 word-level KD until validation BLEU stops improving for 3 epochs"
stage kd fairseq-train "$DATA" "${COMMON[@]}" --criterion kd --label-smoothing 0.1 "${START_FROM[@]}" --patience 3 \
  --eval-bleu --eval-bleu-args '{"beam": 5, "max_len_a": 1.2, "max_len_b": 10}' --eval-bleu-detok moses \
  --eval-bleu-remove-bpe --best-checkpoint-metric bleu --maximize-best-checkpoint-metric \
  --save-dir "$WORK/kd" --no-epoch-checkpoints
say "3/3 teacher vs PET"
stage measure "$PY" -m user_dir.tools.measure "$DATA" --path "$TEACHER" "$WORK/kd/checkpoint_best.pt" --names teacher pet \
  --beam 5 --batch-size 128 --runs 3 "${MEASURE_DEVICE[@]}" --out "$WORK/measure.md" --json "$WORK/measure.json"
[ "$DRY_RUN" = 1 ] || score_measure "$WORK/measure.json" pet
