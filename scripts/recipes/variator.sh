#!/usr/bin/env bash
# Variator (Xiao et al., 2023; user_dir/variator/README.md): a plug-and-play compression plugin of ratio k on a
# frozen backbone -- k hidden vectors merged into one around every encoder FFN, copied back with an adapter --
# trained by distilling the backbone's own final encoder states; the backbone's weights never change.
# A translation backbone (fairseq transformer) or a fine-tuned GLUE encoder (hf_bert):
#   1. pretrain  (GLUE, PRETRAIN_BACKBONE set) the plugin on the pre-trained encoder and unlabelled text
#                (section 3.3 "plugin pre-training"; PRETRAIN_DATA: a sentence_prediction data-bin); pre-training
#                is task-agnostic: PRETRAINED=WORK/pretrained-kK.pt of one run starts another task's adaptation
#   2. plugin    fairseq-train --task variator_translation / variator_sentence_prediction --variator-backbone
#                TEACHER --criterion variator_distill (eq. 1), the backbone's architecture flags read from it
#                with fc-flags; GLUE: adaptation from the pre-trained plugin, the best dev checkpoint kept
#   3. export    python -m user_dir.variator.tools.plugins export -> WORK/plugin-kK.pt (a few hundred KB)
#   4. measure   fc-measure: the backbone alone and with the plugin (the plugin's training checkpoint, which builds
#                the plugged model): BLEU (tok) and sacreBLEU on test (beam 5) / the GLUE metric on REPORT_SUBSET [dev], per-example
#                outputs; 5. cost: encoder FLOPs and speed at length 128 (encoder_cost)
# then WORK_DIR/result.json (scripts/experiments/record.py) and the score line. Finished stages are skipped (WORK/STAGE/DONE), interrupted training resumes, a stage
# finished with other settings is refused.
#
#   bash scripts/recipes/variator.sh [WORK_DIR]       (default work/variator: k = 4 on the shipped Multi30k teacher)
#   TEACHER=rte_teacher.pt DATA=data-bin/RTE.wordpiece GLUE_TASK=RTE PRETRAIN_BACKBONE=models/minilm/model.pt \
#     PRETRAIN_DATA=data-bin/SST-2.wordpiece bash scripts/recipes/variator.sh work/variator-rte
#   K=8 PLACE=att-kv ... ; SMOKE=1 ... ; DRY_RUN=1 ...   another ratio / Att-KV (section 4.7) / tiny / print only
#
# Variables (defaults in brackets):
#   K [4]: the compression ratio (paper: 4; Fig. 3: 2..32); BOTTLENECK [64]: the adapter's r (paper: 64; for
#     backbones much narrower than T5-base choose smaller, e.g. 16: benchmark results/archive/variator.md);
#     PLACE [ffn]: ffn or att-kv; PLUGIN_FLAGS: more --variator-* flags (Table 2's ablations:
#     --variator-compression mean, --variator-decompression copy)
#   UPDATES [translation 400, GLUE 800], PRETRAIN_UPDATES [200], LR [1e-3: the paper's pre-training lr; its
#     adaptation grid {1e-4, 5e-5}], PRETRAIN_LR [LR], WARMUP [50], BATCH [GLUE 16], PRETRAIN_BATCH [BATCH; the
#     paper: 256], MAX_TOKENS [translation 4096], VALIDATIONS
#     [GLUE 4], SEED [1], EXTRA (more fairseq-train flags), DEVICE_FLAGS [--cpu; --fp16 on a GPU], RUNS [1]: timed
#     runs of the measurement
# scripts/recipes/variator_glue_gpu.sh runs the paper's Table 1 setting on a BERT/RoBERTa-base encoder.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin variator "$@"
K="${K:-4}"; BOTTLENECK="${BOTTLENECK:-64}"; PLACE="${PLACE:-ffn}"; SEED="${SEED:-1}"; LR="${LR:-1e-3}"
WARMUP="${WARMUP:-50}"; PRETRAIN_UPDATES="${PRETRAIN_UPDATES:-200}"; PRETRAIN_LR="${PRETRAIN_LR:-$LR}"
[ "$K" -ge 1 ] 2>/dev/null || die "K=$K: the ratio of the plugin to train (an integer >= 1)"
glue_or_translation
flags_of ARCH "$TEACHER"
PLUGIN=(--variator-ratio "$K" --variator-bottleneck "$BOTTLENECK" --variator-place "$PLACE" ${PLUGIN_FLAGS:-})
SMOKE_TRAIN=()
if [ "$MODE" = glue ]; then
  UPDATES="${UPDATES:-800}"; BATCH="${BATCH:-16}"; VALIDATIONS="${VALIDATIONS:-4}"
  TASK=("${TASK_FLAGS[@]}" --task variator_sentence_prediction); BATCHING=(--batch-size "$BATCH")
else
  UPDATES="${UPDATES:-400}"; VALIDATIONS=1; TASK=(--task variator_translation)
  BATCHING=(--max-tokens "${MAX_TOKENS:-4096}")
fi
if [ "$SMOKE" = 1 ]; then
  UPDATES=3; PRETRAIN_UPDATES=2; VALIDATIONS=1; WARMUP=1; SMOKE_TRAIN=(--max-valid-steps 2)
fi
say "backbone $TEACHER ($MODE${GLUE_TASK:+ $GLUE_TASK}, ${ARCH[*]}), data $DATA; plugin k = $K, r = $BOTTLENECK, $PLACE; $UPDATES updates; work $WORK"
OPTIM=(--optimizer adam --adam-betas '(0.9,0.98)' --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP"
       --warmup-init-lr 1e-7 --criterion variator_distill --seed "$SEED")
COMMON=(--user-dir "$ROOT/user_dir" --log-format simple --log-interval 25 --no-epoch-checkpoints --num-workers 0
        "${BATCHING[@]}" $DEVICE_FLAGS "${SMOKE_TRAIN[@]}" ${EXTRA:-})

START=()
if [ "$MODE" = glue ] && [ -n "${PRETRAINED:-}" ]; then
  say "1/5 plugin pre-training done elsewhere: $PRETRAINED"
  START=(--variator-plugins "$PRETRAINED")
elif [ "$MODE" = glue ] && [ -n "${PRETRAIN_BACKBONE:-}" ]; then
  [ -n "${PRETRAIN_DATA:-}" ] || die "PRETRAIN_DATA=...: unlabelled sentences as a sentence_prediction data-bin"
  flags_of PRETRAIN_ARCH "$PRETRAIN_BACKBONE"
  say "1/5 plugin pre-training on $PRETRAIN_BACKBONE, $PRETRAIN_UPDATES updates (no validation)"
  stage pretrain fairseq-train "$PRETRAIN_DATA" "${TASK[@]}" "${PRETRAIN_ARCH[@]}" "${PLUGIN[@]}" "${COMMON[@]}" \
    "${OPTIM[@]}" --lr "$PRETRAIN_LR" --batch-size "${PRETRAIN_BATCH:-$BATCH}" --variator-backbone "$PRETRAIN_BACKBONE" \
    --max-update "$PRETRAIN_UPDATES" --disable-validation --save-dir "$WORK/pretrain"
  stage pretrain-export "$PY" -m user_dir.variator.tools.plugins export "$WORK/pretrain/checkpoint_last.pt" \
    --out "$WORK/pretrained-k$K.pt"
  START=(--variator-plugins "$WORK/pretrained-k$K.pt")
else
  say "1/5 no plugin pre-training (GLUE: PRETRAIN_BACKBONE=... PRETRAIN_DATA=...)"
fi

SELECT=(); CHOSEN=checkpoint_last.pt
if [ "$MODE" = glue ]; then
  interval EVERY "$UPDATES" "$VALIDATIONS"
  SELECT=(--glue-task "$GLUE_TASK" --best-checkpoint-metric "$METRIC" --maximize-best-checkpoint-metric
          --validate-interval-updates "$EVERY" --save-interval-updates "$EVERY" --validate-interval 1000000
          --keep-interval-updates 1)
  CHOSEN=checkpoint_best.pt
fi
say "2/5 plugin k = $K on the frozen backbone (--criterion variator_distill), $UPDATES updates"
stage plugin fairseq-train "$DATA" "${TASK[@]}" "${ARCH[@]}" "${PLUGIN[@]}" "${COMMON[@]}" "${OPTIM[@]}" \
  --variator-backbone "$TEACHER" "${START[@]}" "${SELECT[@]}" --max-update "$UPDATES" --save-dir "$WORK/plugin"
say "3/5 export the plugin (its tensors, configuration and the backbone's signature)"
stage export "$PY" -m user_dir.variator.tools.plugins export "$WORK/plugin/$CHOSEN" --out "$WORK/plugin-k$K.pt"

MEASURE_EXTRA=(); [ "$MODE" = glue ] && MEASURE_EXTRA=(--glue-task "$GLUE_TASK" --gen-subset "$REPORT_SUBSET")
[ "$SMOKE" = 1 ] && MEASURE_EXTRA+=(--max-sentences 20 "${SMOKE_DECODE[@]}")
say "4/5 the backbone alone and with the plugin (fc-measure; the plugged model: the plugin's training checkpoint)"
stage measure "$PY" -m user_dir.tools.measure "$DATA" --path "$TEACHER" "$WORK/plugin/$CHOSEN" --names teacher \
  "variator-k$K" --beam 5 --batch-size 64 --runs "${RUNS:-1}" "${MEASURE_EXTRA[@]}" "${MEASURE_DEVICE[@]}" \
  "${RAW_REFERENCE[@]}" --out "$WORK/measure.md" --json "$WORK/measure.json" --outputs-dir "$WORK/outputs"
COST_RUNS=3; [ "$SMOKE" = 1 ] && COST_RUNS=1
say "5/5 encoder FLOPs and speed at length 128, backbone vs plugin"
stage cost "$PY" -m user_dir.variator.tools.cost "$DATA" --path "$TEACHER" --plugins "$WORK/plugin-k$K.pt" \
  --length 128 --batch-size 4 --runs "$COST_RUNS" --repeats "$COST_RUNS" --json "$WORK/cost.json"
[ "$DRY_RUN" = 1 ] && exit 0
RECORD_VARS="GLUE_TASK REPORT_SUBSET K BOTTLENECK PLACE PLUGIN_FLAGS UPDATES PRETRAIN_UPDATES LR PRETRAIN_LR WARMUP BATCH PRETRAIN_BATCH MAX_TOKENS VALIDATIONS SEED EXTRA DEVICE_FLAGS"
TRAINED=(plugin); STAGES=("${SHIPPED_DATA_STAGE[@]}")
[ -f "$WORK/pretrain/DONE" ] && TRAINED=(pretrain plugin) && STAGES+=(pretrain pretrain-export)
RECORD_ALSO=teacher RECORD_COST="$WORK/cost.json" write_result "variator-k$K" "$WORK/plugin/$CHOSEN" "${STAGES[@]}" plugin export measure cost -- "${TRAINED[@]}"
print_score
