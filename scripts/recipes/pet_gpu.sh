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
#   SMOKE=1 DEVICE_FLAGS=--cpu TEACHER=... DATA=... bash scripts/recipes/pet_gpu.sh work/x   # the same stages on a
#                                                  CPU in a minute: 2 + 3 updates, 2 validation batches, 20 sentences
#
# The teacher comes from scripts/recipes/train_teacher_iwslt14.sh (or any fairseq checkpoint trained on DATA; the data
# from python -m preprocess.prepare_translation). Student dims follow the arch: (320, 240) when the target is
# English, (240, 320) when the source is. Variables: ARCH [pet_transformer_iwslt], SEED [1], WARMUP_EPOCHS [3],
# MAX_EPOCHS [50: the KD stage's bound; --patience 3 usually stops it sooner], LR_WARMUP_FRACTION [0.08],
# MAX_TOKENS [4096; 8192 for pet_transformer_wmt], DEVICE_FLAGS [--fp16], EXTRA (more fairseq-train flags).
# The CPU recipe is scripts/recipes/pet.sh.
#
# The learning-rate warm-up follows the data's size: LR_WARMUP_FRACTION of the KD stage's bound, MAX_EPOCHS epochs
# of DATA's training set in updates of MAX_TOKENS (the tokens of its longer side, end-of-sentence included, over
# MAX_TOKENS: padding not counted, so a slight underestimate). The paper's IWSLT'14 schedule is fairseq's 4,000
# warm-up updates: IWSLT'14 DE->EN's 160,239 training pairs average 26.2 such tokens (measured on its valid set,
# ../shared/data/iwslt14.de-en/bpe), about 1,020 updates of 4,096 tokens per epoch, so 0.08 x 50 epochs gives
# its 4,000 (4,090); on Multi30k (29,000 pairs, 114 updates per epoch) the same rule gives 456, where a fixed
# 4,000 would keep the students warming up for 35 epochs. The warm-up stage (WARMUP_EPOCHS) warms up for the
# same number of updates, at most half its own.
set -euo pipefail
DEVICE_FLAGS="${DEVICE_FLAGS---fp16}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
case "${1:-}" in -h|--help) begin pet-gpu "$@" ;; "") die "usage: TEACHER=... DATA=... bash $0 WORK_DIR (--help)" ;; esac
[ -n "${TEACHER:-}" ] && [ -n "${DATA:-}" ] || die "set TEACHER (the teacher checkpoint) and DATA (its data-bin)"
begin pet-gpu "$@"
ARCH="${ARCH:-pet_transformer_iwslt}"; SEED="${SEED:-1}"; WARMUP_EPOCHS="${WARMUP_EPOCHS:-3}"
MAX_EPOCHS="${MAX_EPOCHS:-50}"; LR_WARMUP_FRACTION="${LR_WARMUP_FRACTION:-0.08}"
if [ "$ARCH" = pet_transformer_wmt ]; then
  MAX_TOKENS="${MAX_TOKENS:-8192}"; OPT=(--lr 7e-4 --dropout 0.1)   # Transformer-base (Vaswani et al.)
else
  MAX_TOKENS="${MAX_TOKENS:-4096}"; OPT=(--lr 5e-4 --dropout 0.3)   # fairseq's IWSLT recipe
fi
[[ "$MAX_EPOCHS" =~ ^[1-9][0-9]*$ ]] || die "MAX_EPOCHS=$MAX_EPOCHS: a whole number of epochs"
[[ "$LR_WARMUP_FRACTION" =~ ^0?\.[0-9]+$ ]] || die "LR_WARMUP_FRACTION=$LR_WARMUP_FRACTION: a fraction below 1, e.g. 0.08"
# updates per epoch of DATA's training set at MAX_TOKENS (the header's rule), and the warm-ups they give
if [ -d "$DATA" ]; then
  PER_EPOCH="$("$PY" - "$DATA" "$MAX_TOKENS" <<'PY'
import glob, math, os, sys
import numpy as np
from fairseq.data import data_utils
data, max_tokens = sys.argv[1], int(sys.argv[2])
prefixes = sorted({p[:-4] for p in glob.glob(os.path.join(data, "train.*-*.*.idx"))})
if len(prefixes) != 2:
    sys.exit(f"DATA={data}: no train.SRC-TGT.SRC/.TGT pair of binarised files (a fairseq translation data-bin?)")
datasets = [data_utils.load_indexed_dataset(p, None) for p in prefixes]  # kept: .sizes reads their memory map
print(max(1, math.ceil(int(np.maximum(*[np.array(d.sizes) for d in datasets]).sum()) / max_tokens)))
PY
)" || die "could not count DATA's training tokens"
  LR_WARMUP=$(awk -v f="$LR_WARMUP_FRACTION" -v e="$MAX_EPOCHS" -v n="$PER_EPOCH" 'BEGIN { w = int(f * e * n + 0.5); print (w > 0 ? w : 1) }')
  WARMUP_STAGE_LR=$(( LR_WARMUP < PER_EPOCH * WARMUP_EPOCHS / 2 ? LR_WARMUP : PER_EPOCH * WARMUP_EPOCHS / 2 ))
  [ "$WARMUP_STAGE_LR" -ge 1 ] || WARMUP_STAGE_LR=1
  say "$DATA: about $PER_EPOCH updates of $MAX_TOKENS tokens per epoch: lr warm-up $LR_WARMUP updates ($LR_WARMUP_FRACTION of $MAX_EPOCHS epochs; the warm-up stage $WARMUP_STAGE_LR)"
else
  [ "$DRY_RUN" = 1 ] || die "DATA=$DATA: no such folder"
  LR_WARMUP="\$(updates $LR_WARMUP_FRACTION x $MAX_EPOCHS epochs of $DATA)"; WARMUP_STAGE_LR="$LR_WARMUP"
fi
BOUND=(--max-epoch "$MAX_EPOCHS"); WARMUP_BOUND=(--max-epoch "$WARMUP_EPOCHS"); VALID_EXTRA=(); MEASURE_EXTRA=()
if [ "$SMOKE" = 1 ]; then
  BOUND=(--max-update 3 --max-epoch 0); WARMUP_BOUND=(--max-update 2 --max-epoch 0); VALID_EXTRA=(--max-valid-steps 2)
  MEASURE_EXTRA=(--max-sentences 20 --runs 1 "${SMOKE_DECODE[@]}")
fi
say "teacher $TEACHER, data $DATA, student --arch $ARCH, work $WORK"
COMMON=(--user-dir "$ROOT/user_dir" --arch "$ARCH" --share-decoder-input-output-embed --optimizer adam
  --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr-scheduler inverse_sqrt --weight-decay 0.0001 "${OPT[@]}"
  --max-tokens "$MAX_TOKENS" --teacher-path "$TEACHER" --seed "$SEED" $DEVICE_FLAGS --log-format simple
  --log-interval 100 "${VALID_EXTRA[@]}" ${EXTRA:-})

START_FROM=()
if [ "$WARMUP_EPOCHS" -gt 0 ]; then
  say "1/3 warm-up on the simplified task, $WARMUP_EPOCHS epochs"
  stage warmup fairseq-train "$DATA" "${COMMON[@]}" --warmup-updates "$WARMUP_STAGE_LR" --criterion pet_warmup \
    "${WARMUP_BOUND[@]}" --save-dir "$WORK/warmup" --no-epoch-checkpoints
  START_FROM=(--finetune-from-model "$WORK/warmup/checkpoint_last.pt")
fi
say "2/3 word-level KD until validation BLEU stops improving for 3 epochs"
stage kd fairseq-train "$DATA" "${COMMON[@]}" --warmup-updates "$LR_WARMUP" --criterion kd --label-smoothing 0.1 \
  "${START_FROM[@]}" "${BOUND[@]}" --patience 3 \
  --eval-bleu --eval-bleu-args '{"beam": 5, "max_len_a": 1.2, "max_len_b": 10}' --eval-bleu-detok moses \
  --eval-bleu-remove-bpe --best-checkpoint-metric bleu --maximize-best-checkpoint-metric \
  --save-dir "$WORK/kd" --no-epoch-checkpoints
say "3/3 teacher vs PET"
stage measure "$PY" -m user_dir.tools.measure "$DATA" --path "$TEACHER" "$WORK/kd/checkpoint_best.pt" --names teacher pet \
  --beam 5 --batch-size 128 --runs 3 "${MEASURE_EXTRA[@]}" "${MEASURE_DEVICE[@]}" --out "$WORK/measure.md" --json "$WORK/measure.json"
[ "$DRY_RUN" = 1 ] || score_measure "$WORK/measure.json" pet
