# What every recipe in scripts/recipes/ shares; sourced, never run. Defines:
#   begin DEFAULT_WORK "$@"      --help (the recipe's header); WORK (the first argument, else work/DEFAULT_WORK),
#                                TEACHER (default the shipped Multi30k teacher, checked) and DATA made absolute
#   stage NAME CMD...      run CMD once: its log is WORK/NAME.log, WORK/NAME/DONE marks it finished (holding the
#                          command); a finished stage is skipped, one finished with another command is refused
#   flags_of VAR [--task] PATH   fc-flags of PATH (user_dir/tools/checkpoint_flags.py) into the array VAR
#   updates_for VAR DATA EPOCHS BATCH   EPOCHS passes over DATA's training examples in updates of BATCH
#   interval VAR UPDATES N       every how many updates N validations fall (a dry run's $(updates ...) stays symbolic)
#   shipped_translation_data     DATA for the shipped teacher: the embedded Multi30k with its BPE codes and dictionary
#   glue_or_translation          MODE=glue (GLUE_TASK set: TASK_FLAGS from the teacher's own task, fc-flags --task, its
#                                METRIC choosing checkpoints) or translation (DATA by shipped_translation_data if unset)
#   print_score                  the run's score line from WORK/result.json (record.py --score: student and teacher)
#   language_pair                SRC and TGT read off DATA's file names unless given
#   student_training             STUDENT_TRAINING: every translation student's one training rule (see there)
#   write_result NAME CHECKPOINT STAGES... -- TRAIN_STAGES...   WORK/result.json (scripts/experiments/record.py) from
#                                WORK/measure.json and WORK/outputs/NAME.txt, with RECORD_VARS' variables, RECORD_ALSO's
#                                rows (scores and outputs beside the student's), RECORD_COST's cost, PRIMARY_METRIC;
#                                references: RAW_REFERENCE's (sacreBLEU's), else WORK/outputs/references.txt
#   bert_teachers                (GPU reproductions) TEACHERS: GLUE teachers from glue_teachers.sh, made from HF_MODEL
# Switches every recipe takes: SMOKE=1 (a tiny budget: an end-to-end check, numbers meaningless), DRY_RUN=1
# (print the commands, run nothing; flags of checkpoints not yet written print as $(fc-flags PATH)),
# DEVICE_FLAGS (default --cpu; e.g. --fp16 on a GPU), PYTHON (default python).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# glibc maps each buffer over 32 MB afresh, so a KD update over 7,892 types spent 35% of its CPU faulting pages in; with
# the heap keeping them, a CAN student's first 80 updates: identical losses, train time 133 -> 89 s (next to a job).
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-4294967296}" MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-17179869184}"
PY="${PYTHON:-python}"
SMOKE="${SMOKE:-0}"; DRY_RUN="${DRY_RUN:-0}"
# SMOKE=1 bounds every test-set decoding at 1.2 x the source length + 10 tokens, as fairseq's IWSLT recipe validates
# (and demo.sh decodes): a student of a few updates otherwise emits fairseq's default 200 tokens per sentence
SMOKE_DECODE=(); [ "$SMOKE" = 1 ] && SMOKE_DECODE=(--max-len-a 1.2 --max-len-b 10)
DEVICE_FLAGS="${DEVICE_FLAGS---cpu}"
# the device switches the plug-in's tools and fc-measure take (they know --cpu and --fp16, not fairseq's others)
TOOL_DEVICE=(); MEASURE_DEVICE=()
[[ " $DEVICE_FLAGS " == *" --cpu "* ]] && TOOL_DEVICE=(--cpu) && MEASURE_DEVICE=(--cpu)
[[ " $DEVICE_FLAGS " == *" --fp16 "* ]] && MEASURE_DEVICE+=(--fp16)
SHIPPED="$ROOT/checkpoints/multi30k.de-en"
RAW_REFERENCE=()  # language_pair: the untokenised references of a translation data-bin, for sacreBLEU
RECIPE="$(basename "$0")"

die() { echo "$RECIPE: $*" >&2; exit 2; }
say() { printf '\n=== %s: %s\n' "$RECIPE" "$*"; }

# absolute PATH: PATH from the current folder (links kept), so that a stage's recorded command, and a resumed run
# started from another folder, name the same files
absolute() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s' "$PWD/$1" ;; esac; }

begin() {
  local default="$1"; shift
  case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;; esac
  WORK="$(mkdir -p "${1:-$ROOT/work/$default}" && cd "${1:-$ROOT/work/$default}" && pwd)"
  TEACHER="$(absolute "${TEACHER:-$SHIPPED/teacher.pt}")"
  [ -z "${DATA:-}" ] || DATA="$(absolute "$DATA")"
  [ -f "$TEACHER" ] || [ "$DRY_RUN" = 1 ] || die "TEACHER=$TEACHER: no such checkpoint"
}

# show CMD...: the command as one shell line, arguments single-quoted where the shell needs it ($(fc-flags ...)
# and $(updates ...) placeholders of a dry run left as they are)
show() {
  local out="" arg q="'"
  for arg in "$@"; do
    if [[ "$arg" == '$(fc-flags '* || "$arg" == '$(updates '* || "$arg" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
      out+="$arg "
    else
      out+="'${arg//$q/$q\\$q$q}' "
    fi
  done
  printf '%s' "${out% }"
}

stage() {
  local name="$1"; shift
  local dir="$WORK/$name" line
  line="$(show "$@")"
  if [ "$DRY_RUN" = 1 ]; then printf '%s\n' "$line"; return 0; fi
  if [ -f "$dir/DONE" ]; then
    [ "$(placed "$(cat "$dir/DONE")")" = "$(placed "$line")" ] || die "stage $name in $dir was finished with another command:
  $(cat "$dir/DONE")
now:
  $line
delete $dir (or choose another work folder) to run it again"
    echo "--- $name: done, skipped ($dir/DONE)"
    return 0
  fi
  # an attempt killed (SIGKILL, a session's end) left its last heartbeat: its time is the stage's too
  [ -f "$dir/TIMES.beat" ] && { sed 's/$/ killed/' "$dir/TIMES.beat" >> "$dir/TIMES"; rm -f "$dir/TIMES.beat"; }
  # a fairseq-train stage killed after its last checkpoint but before its marker: done, not trained on past its rule
  if [ -d "$dir" ] && [ "$1" = fairseq-train ] && "$PY" -m user_dir.tools.training_stopped "$@"; then
    placed "$line" > "$dir/DONE"; echo "--- $name: its checkpoint had met its stopping rule, marked done"; return 0
  fi
  mkdir -p "$dir"
  echo "--- $name: $line"
  local started cpu_before
  started="$(date +%s.%N)"; children_cpu cpu_before
  heartbeat "$dir" "$started" > /dev/null 2>&1 & local beat=$!
  if ! "$@" 2>&1 | tee -a "$WORK/$name.log"; then
    stop_heartbeat "$dir" "$beat"; attempt_time "$dir" "$started" "$cpu_before"; die "stage $name failed; its log: $WORK/$name.log"
  fi
  stop_heartbeat "$dir" "$beat"; attempt_time "$dir" "$started" "$cpu_before"
  placed "$line" > "$dir/DONE"
}

# placed LINE: LINE with the work folder written WORK and the checkout ROOT, so that a work folder carried to another
# place (a lent accelerator's copy of the checkout, and back) resumes there
placed() { local line="${1//"$WORK"/WORK}"; printf '%s\n' "${line//"$ROOT"/ROOT}"; }

# children_cpu VAR: user + system seconds of every child this shell has waited for (bash's times, run in this shell:
# in a command substitution it would count a subshell's children); attempt_time DIR START CPU0 appends one attempt's
# wall and CPU seconds to DIR/TIMES (scripts/experiments/record.py sums them)
children_cpu() {
  local -n _cpu="$1"; local file; file="$(mktemp)"; times > "$file"
  _cpu="$(tail -1 "$file" | awk '{ split($1, u, "m"); split($2, s, "m"); printf "%.2f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }')"
  rm -f "$file"
}
attempt_time() {
  local now cpu_now; now="$(date +%s.%N)"; children_cpu cpu_now
  awk -v a="$2" -v b="$now" -v c0="$3" -v c1="$cpu_now" 'BEGIN { printf "%.1f %.1f\n", b - a, c1 - c0 }' >> "$1/TIMES"
}

# heartbeat DIR START: every HEARTBEAT_S [30] seconds, DIR/TIMES.beat holds the running attempt's wall seconds
# and the CPU seconds of this shell's live descendants (ps), so that an attempt killed where no trap runs still counts
heartbeat() {
  command -v ps > /dev/null || return 0
  while sleep "${HEARTBEAT_S:-30}"; do
    ps -eo pid=,ppid=,times= | awk -v root=$$ -v a="$2" -v now="$(date +%s.%N)" '
      { parent[$1] = $2; cpu[$1] = $3 }
      END { for (p in parent) { q = p; while (q in parent && q != root) q = parent[q]; if (q == root && p != root) t += cpu[p] }
            printf "%.1f %.1f\n", now - a, t }' > "$1/TIMES.beat.tmp" && mv "$1/TIMES.beat.tmp" "$1/TIMES.beat"
  done
}
stop_heartbeat() { kill "$2" 2>/dev/null || true; wait "$2" 2>/dev/null || true; rm -f "$1/TIMES.beat"{,.tmp}; }

flags_of() {
  local -n _flags="$1"; shift
  local path="${!#}" text
  if [ "$DRY_RUN" = 1 ] && [ ! -e "$path" ]; then _flags=("\$(fc-flags $*)"); return 0; fi
  text="$("$PY" -m user_dir.tools.checkpoint_flags --lines "$@" 2>/dev/null)" ||
    die "fc-flags $*: $("$PY" -m user_dir.tools.checkpoint_flags "$@" 2>&1 >/dev/null | tail -1)"
  mapfile -t _flags <<< "$text"
}

updates_for() {
  local -n _updates="$1"
  local data="$2" epochs="$3" batch="$4" examples
  if [ "$DRY_RUN" = 1 ] && [ ! -d "$data" ]; then _updates="\$(updates $epochs epochs of $data at batch $batch)"; return 0; fi
  examples="$("$PY" -c "import sys; from fairseq.data import data_utils
print(len(data_utils.load_indexed_dataset(sys.argv[1], None)))" "$data/input0/train" 2>/dev/null)" ||
    die "$data/input0/train: no binarised training examples (preprocess/prepare_glue.py output?)"
  _updates=$(( (examples + batch - 1) / batch * epochs ))
}

interval() {
  local -n _every="$1"
  if [[ "$2" =~ ^[0-9]+$ ]]; then _every=$(( $2 / $3 )); [ "$_every" -ge 1 ] || _every=1
  else _every="${2%)} / $3)"; fi
}

SHIPPED_DATA_STAGE=()  # (data) once shipped_translation_data has made DATA in WORK
shipped_translation_data() {
  [ -n "${DATA:-}" ] && return 0
  SHIPPED_DATA_STAGE=(data)
  [ "$TEACHER" -ef "$SHIPPED/teacher.pt" ] || die "DATA=...: the binarised data $TEACHER was trained on"
  DATA="$WORK/data-bin"
  local lines=(); [ "$SMOKE" = 1 ] && lines=(--train-lines 1000)
  say "data: the embedded Multi30k DE->EN -> lowercase, Moses tokens -> the teacher's BPE codes and dictionary"
  stage data "$PY" -m preprocess.prepare_multi30k --src de --tgt en --dest "$DATA" --bpe-codes "$SHIPPED/code" \
    --srcdict "$SHIPPED/dict.de.txt" "${lines[@]}"
}

glue_or_translation() {
  if [ -z "${GLUE_TASK:-}" ]; then
    MODE=translation
    shipped_translation_data
    language_pair
    return 0
  fi
  MODE=glue
  [ -n "${DATA:-}" ] || die "DATA=...: the task's data-bin (python -m preprocess.prepare_glue ...)"
  # prepare_glue's layout: 'valid' (a slice of train held out at preparation) chooses, REPORT_SUBSET reports: 'dev'
  # (GLUE's dev set), or MRPC's 'devtest' (dev + the labelled test pairs: ours, for differences dev cannot resolve)
  REPORT_SUBSET="${REPORT_SUBSET:-dev}"
  [ -f "$DATA/input0/$REPORT_SUBSET.idx" ] || [ "$DRY_RUN" = 1 ] ||
    die "DATA=$DATA has no '$REPORT_SUBSET' subset (REPORT_SUBSET): prepare it again (python -m preprocess.prepare_glue ...; 'dev' came when choosing moved to a held-out slice of train, MRPC's 'devtest' needs msr_paraphrase_test.txt)"
  flags_of TASK_FLAGS --task "$TEACHER"
  [ "${TASK_FLAGS[1]:-}" = sentence_prediction ] || [ "$DRY_RUN" = 1 ] ||
    die "GLUE_TASK=$GLUE_TASK, but $TEACHER was trained with ${TASK_FLAGS[*]} (a sentence_prediction teacher?)"
  # the task's checkpoint metric and its primary metric (the score line's), read from user_dir/common/glue_metrics.py's
  # tables (parsed: no import of fairseq)
  local metrics
  metrics="$("$PY" - "$ROOT/user_dir/common/glue_metrics.py" "$GLUE_TASK" <<'PY'
import ast, sys
tables = {t.id: ast.literal_eval(node.value) for node in ast.parse(open(sys.argv[1]).read()).body
          if isinstance(node, ast.Assign) for t in node.targets if getattr(t, "id", "") in ("TASK_METRICS", "BEST_CHECKPOINT_METRIC")}
task = sys.argv[2]
if task not in tables["TASK_METRICS"]:
    sys.exit(f"GLUE_TASK={task}: one of {', '.join(sorted(tables['TASK_METRICS']))}")
print(tables["BEST_CHECKPOINT_METRIC"].get(task, tables["TASK_METRICS"][task][0]), tables["TASK_METRICS"][task][0])
PY
)" || exit 2
  read -r METRIC PRIMARY_METRIC <<< "$metrics"
}

print_score() { "$PY" "$ROOT/scripts/experiments/record.py" --score "$WORK/result.json"; }

bert_teachers() {
  if [ -n "${TEACHERS:-}" ]; then
    TEACHERS="$(cd "$TEACHERS" && pwd)"; say "teachers: $TEACHERS (TASK/checkpoints/checkpoint_best.pt, data-bin/TASK.wordpiece)"
    return 0
  fi
  [ -n "${HF_MODEL:-}" ] || die "HF_MODEL=path/to/bert-base-uncased (a Hugging Face BERT directory), or TEACHERS=a folder of fine-tuned teachers"
  [ -n "${GLUE_DIR:-}" ] || die "GLUE_DIR=path/to/glue (the GLUE TSVs: RTE/train.tsv, ...)"
  TEACHERS="$WORK/teachers"
  say "teachers: $HF_MODEL imported and fine-tuned on $TASKS with scripts/recipes/glue_teachers.sh (512 positions, fp16, lr $TEACHER_LRS)"
  local cmd=(env HF_MODEL="$HF_MODEL" GLUE_DIR="$GLUE_DIR" GPU=1 TASKS="$TASKS" LRS="$TEACHER_LRS"
             SEGMENTS="${SEGMENTS:-0}" WORK="$TEACHERS" bash "$ROOT/scripts/recipes/glue_teachers.sh")
  if [ "$DRY_RUN" = 1 ]; then show "${cmd[@]}"; echo; else "${cmd[@]}"; fi
}

language_pair() {
  if [ -z "${SRC:-}" ] || [ -z "${TGT:-}" ]; then  # the language pair from the data-bin's file names
    local pair
    pair=$(cd "$DATA" 2>/dev/null && ls train.*-*.*.idx 2>/dev/null | head -1 | cut -d. -f2 || true)
    [ -n "$pair" ] || [ "$DRY_RUN" = 1 ] || die "$DATA has no train.SRC-TGT.*.idx (a fairseq translation data-bin?)"
    [ -n "$pair" ] || pair=de-en
    SRC="${SRC:-${pair%-*}}"; TGT="${TGT:-${pair#*-}}"
  fi
  RAW_REFERENCE=()  # untokenised references for sacreBLEU, where the preparer kept them
  [ -f "$DATA/text/test.raw.$TGT" ] && RAW_REFERENCE=(--raw-reference "$DATA/text/test.raw.$TGT")
  return 0
}

# The one training rule of every translation student (PET's KD stage and each competitor), all variables:
#   LR [1e-3], LR_WARMUP [500] (inverse_sqrt from 1e-7), MAX_TOKENS [2048], DROPOUT [0.1], SEED [1];
#   the stopping rule: PATIENCE [3] validations without a better validation loss (PET's paper: "stops improving on
#   the validation set over three epochs"; fairseq's --patience), validated every VALIDATE_EVERY [1] epochs, at most
#   MAX_EPOCHS [60] epochs (a cap, stated); UPDATES=N instead trains exactly N updates (PATIENCE ignored).
#   The checkpoint of best validation loss is the one scored.
student_training() {
  LR="${LR:-1e-3}"; LR_WARMUP="${LR_WARMUP:-500}"; MAX_TOKENS="${MAX_TOKENS:-2048}"; DROPOUT="${DROPOUT:-0.1}"
  SEED="${SEED:-1}"; PATIENCE="${PATIENCE:-3}"; VALIDATE_EVERY="${VALIDATE_EVERY:-1}"; MAX_EPOCHS="${MAX_EPOCHS:-60}"
  STUDENT_TRAINING=(--optimizer adam --adam-betas '(0.9,0.98)' --lr "$LR" --lr-scheduler inverse_sqrt
    --warmup-updates "$LR_WARMUP" --warmup-init-lr 1e-7 --weight-decay 1e-4 --dropout "$DROPOUT"
    --max-tokens "$MAX_TOKENS" $DEVICE_FLAGS --seed "$SEED" --no-epoch-checkpoints --log-format simple
    --log-interval 50 --validate-interval "$VALIDATE_EVERY" --best-checkpoint-metric loss)
  if [ -n "${UPDATES:-}" ]; then STOPPING=(--max-update "$UPDATES" --max-epoch 0)
  else STOPPING=(--max-epoch "$MAX_EPOCHS" --patience "$PATIENCE"); fi
  [ "$SMOKE" = 1 ] && STUDENT_TRAINING+=(--max-valid-steps 2) && STOPPING=(--max-update "${UPDATES:-3}" --max-epoch 0)
  return 0
}

write_result() {
  local name="$1" checkpoint="$2"; shift 2
  local stages=() train=() var vars=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do stages+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  train=("$@")
  for var in ${RECORD_VARS:-}; do vars+=(--var "$var=${!var:-}"); done
  for var in ${RECORD_ALSO:-}; do vars+=(--also "$var"); done
  [ -n "${RECORD_COST:-}" ] && vars+=(--cost "$RECORD_COST")
  [ -n "${PRIMARY_METRIC:-}" ] && vars+=(--primary-metric "$PRIMARY_METRIC")
  "$PY" "$ROOT/scripts/experiments/record.py" "$WORK" --recipe "$RECIPE" --name "$name" --stages "${stages[@]}" \
    --train-stages "${train[@]}" --checkpoint "$checkpoint" --measure "$WORK/measure.json" \
    --outputs "$WORK/outputs/$name.txt" --teacher "$TEACHER" --data "$DATA" --device-flags="$DEVICE_FLAGS" \
    --split "${REPORT_SUBSET:-test}" --references "${RAW_REFERENCE[1]:-$WORK/outputs/references.txt}" "${vars[@]}"
}
