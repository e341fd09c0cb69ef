#!/usr/bin/env bash
# The GPU check (issue 31): every method of the plug-in trains a few updates on the shipped teacher's
# data in float32 (the reference), with --fp16 and with --bf16 (as fairseq takes it, and with its implied
# --tpu undone: bf16-notpu below), validates, translates a few test sentences (fairseq-generate, and
# CTranslate2 on the same device where it is installed); one table says per row: finished, final loss,
# finite, seconds.
#
#   bash scripts/maint/gpu_check.sh                                  # a CUDA machine -> work/gpu_check/gpu_check.md
#   bash scripts/maint/gpu_check.sh --budget 320 --jobs 16 --out results/gpu_check.md   # the device machine (fetch first:
#                                                              # scripts/maint/gpu_check_fetch.sh, carried wheels/gpu)
#   DEVICE=cpu PYTHON=.venv/bin/python bash scripts/maint/gpu_check.sh      # the same pipeline on a CPU (no fp16 rows)
#   bash scripts/maint/gpu_check.sh --only pet,apc --precisions bf16-notpu  # a part of it
#
# Options: --only METHODS (comma-separated, of: pet word-kd patient-kd can variator ghost apc),
# --precisions LIST (of fp32 fp16 bf16 bf16-notpu amp memory-efficient-fp16; default fp32,fp16,bf16,
# bf16-notpu; a CPU runs fp32, bf16 and bf16-notpu only), --updates N (per training step; default 10 on
# CUDA, 3 on a CPU), --jobs N (method chains at a time; default 8 on CUDA, 1 on a CPU), --budget SECONDS
# (start no step after this long: the report lists the rest as still to run, exit status 3, and the same
# command continues), --work DIR (default work/gpu_check), --out FILE (the report; default
# WORK/gpu_check.md: results/gpu_check.md only when named, and only from a GPU run), --fresh (forget
# earlier rows), --setup-only (stage 1 alone, then stop: another script then runs on the device with
# PYTHONPATH=$PWD:WORK/site, e.g. scripts/bench/bench_ghost_costs.py --device cuda), --dry-run (print each
# row's command, run nothing; the flags that ghost_prune and apc_init write show as <...>).
# Environment: DEVICE (auto: cuda where torch sees one, else stop; cpu), PYTHON (default python3: the
# one that holds torch), WHEELS (default wheels/gpu), OMP_NUM_THREADS (per job; CPU default 1),
# TRAIN_LINES, VALID_LINES, TEST_LINES, MAX_TOKENS (the data slice and batch size, below).
#
# Stages, each resumable (a marker in WORK; a second command continues where the first stopped):
# 1. set-up: the machine's own torch (a CUDA torch is ~800 MB: it is never carried); if fairseq or a
#    package it needs is missing, the wheels in WHEELS (scripts/maint/gpu_check_fetch.sh) go into WORK/site
#    (pip --target, on PYTHONPATH) and fairseq-fixed is built from its source archive against this
#    torch, as scripts/setup_env.sh builds it (no build isolation, parallel build_ext, no ninja),
#    without its CUDA extensions (fairseq builds them only with CUDA_HOME set; translation needs none),
#    and without torchaudio (every install is --no-deps; see scripts/maint/gpu_check_fetch.sh);
# 2. data: the embedded Multi30k DE->EN (preprocess/data), its first TRAIN_LINES (2000) training,
#    VALID_LINES (200) validation and TEST_LINES (100) test pairs, through the teacher's BPE codes and
#    dictionary (checkpoints/multi30k.de-en/), as scripts/demo.sh prepares it;
# 3. rows: per precision and method, the steps below (one row each), a chain stopping at its first
#    failure; fairseq-train runs validate at their end; every output goes to WORK/rows/PREC/METHOD/STEP/
#    (command, log, exit code, seconds); a finished step is never rerun;
# 4. the report (scripts/maint/gpu_check_report.py): losses and finiteness from each log, finiteness of the
#    weights of each saved checkpoint, BLEU of the translations, the machine and versions.
# Methods (the students are small; the teacher is the shipped 3+3-layer, 256-wide Transformer):
#   pet         pet_transformer_iwslt 128/96: --criterion pet_warmup, then kd from the warmed checkpoint
#   word-kd     a plain 2+2-layer Transformer of PET's widths, --criterion kd; its student also through
#               CTranslate2 (user_dir/deploy/ct2_engine.py's converter and decoder, compute type of the row)
#   patient-kd  the same plain student, --criterion patient_kd
#   can         can_transformer_iwslt, 3 encoder layers, 1 compressed-attention decoder layer, kd
#   variator    plugins of ratio 4 on the teacher's FFNs: --task variator_translation, variator_distill;
#               exported (user_dir.variator.tools.plugins) and attached in fairseq-generate
#   ghost       user_dir.ghost.tools.prune (m = 2/4, ghost modules after O and FFN2), then ghost_distill
#   apc         user_dir.apc.tools.init (FFNs 1024 -> 256, neuron pruning), apc_activation_kd,
#               user_dir.apc.tools.finalize, then generation with the finalized (stock) checkpoint
# Precisions: fp32 (no flag), fp16 (--fp16), amp (--amp), memory-efficient-fp16 (CUDA only), bf16 (--bf16 as
# fairseq takes it: fairseq 0.12 turns --bf16 into --tpu, fairseq/options.py, and its Trainer then asks
# torch_xla for a device), bf16-notpu (--bf16 through fc-train-bf16, user_dir/tools/train_bf16.py, which undoes that one
# implication and runs fairseq_cli.train unchanged: fairseq's own bfloat16 training on CUDA or a CPU).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
CMDLINE="bash scripts/maint/gpu_check.sh${*:+ $*}"
[ "${DEVICE:-auto}" = auto ] || CMDLINE="DEVICE=$DEVICE $CMDLINE"
ALL_METHODS="pet word-kd patient-kd can variator ghost apc"
ONLY=""; PRECISIONS=""; UPDATES=""; JOBS=""; BUDGET=0; WORK=work/gpu_check; OUT=""; FRESH=0; DRY_RUN=0; SETUP_ONLY=0
usage() { sed -n '2,57p' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY="${2//,/ }"; shift 2 ;;
    --precisions) PRECISIONS="${2//,/ }"; shift 2 ;;
    --updates) UPDATES="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --work) WORK="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --fresh) FRESH=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --setup-only) SETUP_ONLY=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; usage 2 ;;
  esac
done
for m in $ONLY; do
  [[ " $ALL_METHODS " == *" $m "* ]] || { echo "gpu_check.sh: --only $m: not one of: $ALL_METHODS" >&2; exit 2; }
done
for p in $PRECISIONS; do
  [[ " fp32 fp16 bf16 bf16-notpu amp memory-efficient-fp16 " == *" $p "* ]] ||
    { echo "gpu_check.sh: --precisions $p: not one of fp32 fp16 bf16 bf16-notpu amp memory-efficient-fp16" >&2; exit 2; }
done
for v in BUDGET ${UPDATES:+UPDATES} ${JOBS:+JOBS}; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: --$(tr 'A-Z' 'a-z' <<< "$v") must be a number, got '${!v}'" >&2; exit 2; }
done
METHODS="${ONLY:-$ALL_METHODS}"
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-wheels/gpu}"
SHIPPED=checkpoints/multi30k.de-en
TEACHER="$SHIPPED/teacher.pt"
TRAIN_LINES="${TRAIN_LINES:-2000}"; VALID_LINES="${VALID_LINES:-200}"; TEST_LINES="${TEST_LINES:-100}"
MAX_TOKENS="${MAX_TOKENS:-4096}"
START=$(date +%s)
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # GNU nproc reports OMP_NUM_THREADS where it is set
DEADLINE=$(( BUDGET > 0 ? START + BUDGET : 0 ))
say() { printf '[gpu_check %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { echo "gpu_check.sh: $*" >&2; exit 2; }
past_deadline() { [ "$DEADLINE" -gt 0 ] && [ "$(date +%s)" -ge "$DEADLINE" ]; }

[ "$FRESH" = 1 ] && [ "$DRY_RUN" = 0 ] && rm -rf "$WORK"
mkdir -p "$WORK"
SITE="$ROOT/$WORK/site"; [[ "$WORK" = /* ]] && SITE="$WORK/site"
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
unset TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD TORCH_FORCE_WEIGHTS_ONLY_LOAD  # a user's shell: torch's default loading

# ---- the machine -----------------------------------------------------------------------------------
read -r CUDA TORCH_VERSION PYVER < <("$PYTHON" -c 'import sys, torch
print(int(torch.cuda.is_available()), torch.__version__, "%d.%d" % sys.version_info[:2])' 2>/dev/null) || true
[ -n "${PYVER:-}" ] || die "$PYTHON cannot import torch: the check uses the machine's own torch (set PYTHON)"
DEVICE="${DEVICE:-auto}"
if [ "$DEVICE" = auto ]; then
  [ "$CUDA" = 1 ] || die "torch sees no CUDA device; DEVICE=cpu runs the CPU variant of the check"
  DEVICE=cuda
fi
[ "$DEVICE" = cuda ] || [ "$DEVICE" = cpu ] || die "DEVICE must be auto, cuda or cpu, got '$DEVICE'"
[ "$DEVICE" = cpu ] || [ "$CUDA" = 1 ] || die "DEVICE=cuda but torch sees no CUDA device"
PRECISIONS="${PRECISIONS:-fp32 fp16 bf16 bf16-notpu}"
if [ "$DEVICE" = cuda ]; then
  UPDATES="${UPDATES:-10}"; JOBS="${JOBS:-8}"; THREADS="${OMP_NUM_THREADS:-$(( CORES / JOBS > 0 ? CORES / JOBS : 1 ))}"
else
  UPDATES="${UPDATES:-3}"; JOBS="${JOBS:-1}"; THREADS="${OMP_NUM_THREADS:-1}"
fi
export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
# what makes rows comparable: a work folder holds the rows of one setting
SETTINGS="device=$DEVICE updates=$UPDATES max_tokens=$MAX_TOKENS train_lines=$TRAIN_LINES valid_lines=$VALID_LINES test_lines=$TEST_LINES"
if [ "$DRY_RUN" = 0 ]; then
  if [ -f "$WORK/settings" ] && [ "$(cat "$WORK/settings")" != "$SETTINGS" ]; then
    die "$WORK holds rows made with '$(cat "$WORK/settings")', not '$SETTINGS': pass --fresh or another --work"
  fi
  echo "$SETTINGS" > "$WORK/settings"
  echo "$CMDLINE" >> "$WORK/commands"  # every command that added rows, for the report
fi
PRECISIONS_RUN=""
for p in $PRECISIONS; do
  if [ "$DEVICE" = cpu ] && [[ "$p" != fp32 && "$p" != bf16* ]]; then continue; fi
  PRECISIONS_RUN="$PRECISIONS_RUN $p"
done
say "device $DEVICE, precisions$PRECISIONS_RUN, methods $METHODS, $UPDATES updates, $JOBS job(s) x $THREADS thread(s)"

# ---- 1. set-up -------------------------------------------------------------------------------------
# module -> distribution, for what fairseq, the plug-in and preprocess/ import
REQUIRED="torch:torch numpy:numpy scipy:scipy sklearn:scikit-learn sacrebleu:sacrebleu regex:regex yaml:PyYAML
  tqdm:tqdm packaging:packaging hydra:hydra-core omegaconf:omegaconf antlr4:antlr4-python3-runtime
  bitarray:bitarray sacremoses:sacremoses subword_nmt:subword-nmt"
missing() {  # the distributions of REQUIRED and fairseq-fixed (and what builds it) that PYTHON cannot import
  "$PYTHON" - $REQUIRED fairseq:fairseq-fixed <<'PY'
import importlib.util, sys
lacking = [d for m, d in (a.split(":") for a in sys.argv[1:]) if importlib.util.find_spec(m) is None]
if "fairseq-fixed" in lacking:  # built from its source here: its build needs these
    lacking += [d for m, d in [("Cython", "Cython"), ("setuptools", "setuptools"), ("wheel", "wheel")]
                if importlib.util.find_spec(m) is None]
print(" ".join(lacking))
PY
}
setup() {
  local lacking wheels_for=() fairseq_source spec
  lacking="$(missing)"
  [ -z "$lacking" ] && { echo "preinstalled" > "$WORK/setup.done"; return; }
  local installed="$lacking"
  say "1/4 set-up: $PYTHON lacks: $lacking (from $WHEELS into $SITE)"
  for spec in $lacking; do [ "$spec" != fairseq-fixed ] && wheels_for+=("$spec"); done
  if [ ${#wheels_for[@]} -gt 0 ]; then
    [ -d "$WHEELS" ] || die "no $WHEELS: run 'bash scripts/maint/gpu_check_fetch.sh --python-version $PYVER' where PyPI is reachable and carry $WHEELS"
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --upgrade \
      --find-links "$WHEELS" --target "$SITE" "${wheels_for[@]}" ||
      die "installing ${wheels_for[*]} from $WHEELS failed: fetch them for Python $PYVER with bash scripts/maint/gpu_check_fetch.sh --python-version $PYVER --packages '...'"
  fi
  if [[ " $lacking " == *" fairseq-fixed "* ]]; then
    fairseq_source="$(ls "$WHEELS"/fairseq_fixed-0.12.3.1.tar.gz 2>/dev/null || true)"
    [ -n "$fairseq_source" ] || die "no $WHEELS/fairseq_fixed-0.12.3.1.tar.gz: run bash scripts/maint/gpu_check_fetch.sh"
    mkdir -p "$WORK/build"
    if ! ls "$WORK"/build/fairseq_fixed-*.whl >/dev/null 2>&1; then
      say "1/4 set-up: building fairseq-fixed against torch $TORCH_VERSION ($CORES cores; minutes)"
      local cfg no_ninja
      cfg="$(mktemp)"; printf '[build_ext]\nparallel = %s\n' "$CORES" > "$cfg"
      # a `ninja` that fails `ninja --version` makes torch use its plain (parallel-safe) builder
      no_ninja="$(mktemp -d)"; printf '#!/bin/sh\nexit 1\n' > "$no_ninja/ninja"; chmod +x "$no_ninja/ninja"
      env -u CUDA_HOME PATH="$no_ninja:$PATH" DIST_EXTRA_CONFIG="$cfg" \
        "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-index --no-build-isolation --no-deps \
        -w "$WORK/build.tmp" "$fairseq_source" > "$WORK/build.log" 2>&1 ||
        { tail -20 "$WORK/build.log" >&2; die "building fairseq-fixed failed (log: $WORK/build.log)"; }
      mv "$WORK"/build.tmp/fairseq_fixed-*.whl "$WORK/build/"
      rm -rf "$cfg" "$no_ninja" "$WORK/build.tmp"
    fi
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --upgrade \
      --target "$SITE" "$WORK"/build/fairseq_fixed-*.whl
  fi
  lacking="$(missing)"
  [ -z "$lacking" ] || die "still missing after the set-up: $lacking; fetch them here with: bash scripts/maint/gpu_check_fetch.sh --python-version $PYVER --packages 'NAME==VERSION ...'"
  echo "installed into $WORK/site from $WHEELS: $installed$([[ " $installed " != *" fairseq-fixed "* ]] ||
    echo " (fairseq-fixed built from its source against torch $TORCH_VERSION)")" > "$WORK/setup.done"
}
SETUP_START=$(date +%s)
if [ "$DRY_RUN" = 1 ]; then
  say "1/4 set-up and 2/4 data: not in a dry run"
elif [ -f "$WORK/setup.done" ] && [ -z "$(missing)" ]; then
  say "1/4 set-up: done before ($(cat "$WORK/setup.done"))"
else
  setup
  echo "$(( $(date +%s) - SETUP_START ))" > "$WORK/setup.seconds"
fi
[ "$DRY_RUN" = 1 ] || "$PYTHON" -c "import fairseq, fairseq_cli.train, user_dir" > "$WORK/import.log" 2>&1 ||
  { tail -5 "$WORK/import.log" >&2; die "fairseq or the plug-in does not import with $PYTHON (log: $WORK/import.log)"; }
if [ "$SETUP_ONLY" = 1 ]; then
  say "set-up only: done; run the device's scripts with PYTHONPATH=$PYTHONPATH"
  exit 0
fi

# ---- 2. data ---------------------------------------------------------------------------------------
DATA="$WORK/data-bin"
if [ "$DRY_RUN" = 0 ] && [ ! -f "$WORK/data.done" ]; then
  say "2/4 data: Multi30k DE->EN, $TRAIN_LINES/$VALID_LINES/$TEST_LINES train/valid/test pairs, the teacher's BPE and dictionary"
  RAW="$WORK/raw"; mkdir -p "$RAW"
  for pair in "train:$TRAIN_LINES" "val:$VALID_LINES" "test_2016_flickr:$TEST_LINES"; do
    for lang in de en; do
      zcat "preprocess/data/multi30k.de-en/${pair%%:*}.$lang.gz" | sed -n "1,${pair##*:}p" > "$RAW/${pair%%:*}.$lang"
    done
  done
  "$PYTHON" -m preprocess.prepare_multi30k --src de --tgt en --raw-dir "$RAW" --dest "$DATA" \
    --bpe-codes "$SHIPPED/code" --srcdict "$SHIPPED/dict.de.txt" --workers "$THREADS" --force > "$WORK/data.log" 2>&1 ||
    { tail -20 "$WORK/data.log" >&2; die "data preparation failed (log: $WORK/data.log)"; }
  touch "$WORK/data.done"
fi

# ---- 3. rows ---------------------------------------------------------------------------------------
steps_of() {  # the steps of a method, in order: NAME:KIND
  case "$1" in
    pet) echo "1-warmup:train 2-kd:train 3-generate:generate" ;;
    word-kd) echo "1-kd:train 2-generate:generate 3-ctranslate2:ct2" ;;
    patient-kd|can) echo "1-kd:train 2-generate:generate" ;;
    variator) echo "1-train:train 2-export:tool 3-generate:generate" ;;
    ghost) echo "1-prune:tool 2-distill:train 3-generate:generate" ;;
    apc) echo "1-init:tool 2-train:train 3-finalize:tool 4-generate:generate" ;;
  esac
}
precision_flags() {
  case "$1" in
    fp32) ;; fp16) echo --fp16 ;; bf16|bf16-notpu) echo --bf16 ;; amp) echo --amp ;;
    memory-efficient-fp16) echo --memory-efficient-fp16 ;;
  esac
}
# the recipe's optimisation (scripts/bench/bench_translation.py's OPTIM) with the lr warm-up fitted to the budget
TRAIN=(--user-dir user_dir --optimizer adam --adam-betas "(0.9,0.98)" --lr-scheduler inverse_sqrt
  --warmup-init-lr 1e-7 --warmup-updates "$(( UPDATES > 1 ? UPDATES / 2 : 1 ))" --weight-decay 1e-4 --dropout 0.1
  --max-tokens "$MAX_TOKENS" --max-update "$UPDATES" --seed 1 --log-format simple --log-interval 1
  --no-progress-bar --num-workers 0 --no-epoch-checkpoints)
GENERATE=(--user-dir user_dir --gen-subset test --beam 5 --batch-size 64 --max-len-a 1.2 --max-len-b 10
  --remove-bpe --seed 1)
CPU_FLAG=(); [ "$DEVICE" = cpu ] && CPU_FLAG=(--cpu)
PLAIN=(--arch transformer_iwslt_de_en --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128
  --decoder-embed-dim 96 --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 192 --encoder-attention-heads 4
  --decoder-attention-heads 4 --share-decoder-input-output-embed)
PET=(--arch pet_transformer_iwslt --encoder-embed-dim 128 --decoder-embed-dim 96 --share-decoder-input-output-embed)
CAN=(--arch can_transformer_iwslt --encoder-layers 3 --decoder-layers 1 --encoder-embed-dim 128
  --decoder-embed-dim 128 --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 4
  --decoder-attention-heads 4 --share-decoder-input-output-embed)
TEACHER_ARCH=(--arch transformer_iwslt_de_en --encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256
  --decoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4
  --decoder-attention-heads 4 --share-all-embeddings)
KD=(--criterion kd --label-smoothing 0.1 --teacher-path "$TEACHER")

# run_step ROW CHECKPOINT COMMAND...: one row; 0 when it finished (now or in an earlier command)
run_step() {
  local row="$1" ckpt="$2" started elapsed_ms rc; shift 2
  if [ "$DRY_RUN" = 1 ]; then printf '%s\t%s\n' "${row#"$WORK"/rows/}" "$(printf '%q ' "$@")"; return 0; fi
  if [ -f "$row/rc" ]; then return "$(cat "$row/rc")"; fi
  if past_deadline; then return 124; fi
  rm -f "$row/skipped"
  printf '%q ' "$@" > "$row/command"; echo >> "$row/command"
  [ -n "$ckpt" ] && echo "$ckpt" > "$row/checkpoint"
  started=$(date +%s%N)
  if "$@" > "$row/log" 2>&1; then rc=0; else rc=$?; fi
  elapsed_ms=$(( ($(date +%s%N) - started) / 1000000 ))  # shell arithmetic: the device image has no bc
  printf '%d.%03d\n' $(( elapsed_ms / 1000 )) $(( elapsed_ms % 1000 )) > "$row/seconds"
  echo "$rc" > "$row/rc"
  say "$(tr / ' ' <<< "${row#"$WORK"/rows/}"): $([ "$rc" = 0 ] && echo finished || echo "FAILED (exit $rc)")" \
    "in $(printf '%.0f' "$(cat "$row/seconds")") s"
  return "$rc"
}
skip() {  # skip ROW WHY
  if [ "$DRY_RUN" = 1 ]; then printf '%s\tskipped: %s\n' "${1#"$WORK"/rows/}" "$2"; else echo "$2" > "$1/skipped"; fi
}
# tool_flags CHECKPOINT: its fairseq-train architecture flags, one a line (fc-flags, the one way every tool and
# recipe hands them on; the stored dropout kept)
tool_flags() {
  if [ "$DRY_RUN" = 1 ]; then echo "<the flags of $1>"
  else "$PYTHON" -m user_dir.tools.checkpoint_flags --with-regularisation --lines "$1"; fi
}

chain() {  # chain PRECISION METHOD: the method's steps in order, stopping at the first that did not finish
  local prec="$1" method="$2" dir prec_flags gen_prec
  dir="$WORK/rows/$prec/$method"
  read -r -a prec_flags <<< "$(precision_flags "$prec") ${CPU_FLAG[*]}"
  gen_prec=("${CPU_FLAG[@]}"); [ "$prec" = fp16 ] && gen_prec+=(--fp16)  # fairseq-generate has only --fp16
  # peak learning rates: APC's paper step size 1e-4 (section 4.3, as scripts/bench/bench_apc.py), GhostBERT's
  # distillation as scripts/bench/bench_ghost.py, the students' as scripts/bench/bench_translation.py
  local lr=1e-3; [ "$method" = apc ] && lr=1e-4; [ "$method" = ghost ] && lr=5e-4
  local train=("$PYTHON" -m fairseq_cli.train "$DATA" "${TRAIN[@]}" --lr "$lr" "${prec_flags[@]}")
  [ "$prec" = bf16-notpu ] && train=("$PYTHON" -m user_dir.tools.train_bf16 "${train[@]:3}")
  local generate=("$PYTHON" -m fairseq_cli.generate "$DATA" "${GENERATE[@]}" "${gen_prec[@]}")
  case "$method" in
    pet)
      run_step "$dir/1-warmup" "$dir/1-warmup/checkpoint_last.pt" "${train[@]}" "${PET[@]}" --criterion pet_warmup \
        --teacher-path "$TEACHER" --save-dir "$dir/1-warmup" || return 0
      run_step "$dir/2-kd" "$dir/2-kd/checkpoint_last.pt" "${train[@]}" "${PET[@]}" "${KD[@]}" \
        --finetune-from-model "$dir/1-warmup/checkpoint_last.pt" --save-dir "$dir/2-kd" || return 0
      run_step "$dir/3-generate" "" "${generate[@]}" --path "$dir/2-kd/checkpoint_last.pt" ;;
    word-kd|patient-kd|can)
      local arch=("${PLAIN[@]}") criterion=("${KD[@]}")
      [ "$method" = can ] && arch=("${CAN[@]}")
      [ "$method" = patient-kd ] && criterion=(--criterion patient_kd --label-smoothing 0.1 --teacher-path "$TEACHER")
      run_step "$dir/1-kd" "$dir/1-kd/checkpoint_last.pt" "${train[@]}" "${arch[@]}" "${criterion[@]}" \
        --save-dir "$dir/1-kd" || return 0
      run_step "$dir/2-generate" "" "${generate[@]}" --path "$dir/1-kd/checkpoint_last.pt" || return 0
      [ "$method" = word-kd ] && ct2_step "$prec" "$dir" ;;
    variator)
      local plugged=(--task variator_translation --variator-ratio 4)
      run_step "$dir/1-train" "$dir/1-train/checkpoint_last.pt" "${train[@]}" "${plugged[@]}" "${TEACHER_ARCH[@]}" \
        --variator-backbone "$TEACHER" --variator-bottleneck 16 --criterion variator_distill \
        --save-dir "$dir/1-train" || return 0
      run_step "$dir/2-export" "$dir/2-export/k4.pt" "$PYTHON" -m user_dir.variator.tools.plugins export \
        "$dir/1-train/checkpoint_last.pt" --ratio 4 --out "$dir/2-export/k4.pt" || return 0
      run_step "$dir/3-generate" "" "${generate[@]}" "${plugged[@]}" --path "$TEACHER" \
        --variator-plugins "$dir/2-export/k4.pt" ;;
    ghost)
      run_step "$dir/1-prune" "$dir/1-prune/init.pt" "$PYTHON" -m user_dir.ghost.tools.prune "$DATA" --path "$TEACHER" \
        --width-mult 2/4 --max-batches 4 "${CPU_FLAG[@]}" --out "$dir/1-prune/init.pt" || return 0
      local flags; mapfile -t flags < <(tool_flags "$dir/1-prune/init.pt")
      run_step "$dir/2-distill" "$dir/2-distill/checkpoint_last.pt" "${train[@]}" "${flags[@]}" --criterion ghost_distill \
        --teacher-path "$TEACHER" --finetune-from-model "$dir/1-prune/init.pt" --save-dir "$dir/2-distill" || return 0
      run_step "$dir/3-generate" "" "${generate[@]}" --path "$dir/2-distill/checkpoint_last.pt" ;;
    apc)
      run_step "$dir/1-init" "$dir/1-init/init.pt" "$PYTHON" -m user_dir.apc.tools.init "$TEACHER" --data "$DATA" \
        --encoder-ffn-dims 256 --decoder-ffn-dims 256 --init neuron-pruning --importance-batches 4 --samples 500 \
        --out "$dir/1-init/init.pt" || return 0
      local flags; mapfile -t flags < <(tool_flags "$dir/1-init/init.pt")
      run_step "$dir/2-train" "$dir/2-train/checkpoint_last.pt" "${train[@]}" "${flags[@]}" \
        --criterion apc_activation_kd --finetune-from-model "$dir/1-init/init.pt" --save-dir "$dir/2-train" || return 0
      run_step "$dir/3-finalize" "$dir/3-finalize/final.pt" "$PYTHON" -m user_dir.apc.tools.finalize \
        "$dir/2-train/checkpoint_last.pt" --out "$dir/3-finalize/final.pt" || return 0
      run_step "$dir/4-generate" "" "${generate[@]}" --path "$dir/3-finalize/final.pt" ;;
  esac
  return 0
}

# CTranslate2: its own fairseq converter (ct2_engine convert), then its Translator on DEVICE in the
# row's compute type (ct2_engine's decode; its command line decodes on the CPU only)
ct2_step() {
  local prec="$1" dir="$2" row="$2/3-ctranslate2" why compute
  why=$("$PYTHON" - "$DEVICE" <<'PY'
import importlib.util, sys
if importlib.util.find_spec("ctranslate2") is None:
    print("ctranslate2 is not installed (its 43 MB wheel does not fit beside the repository in a device call)")
else:
    import ctranslate2
    if sys.argv[1] == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        print(f"ctranslate2 {ctranslate2.__version__} sees no CUDA device")
PY
) || why="ctranslate2 does not import (see: $PYTHON -c 'import ctranslate2')"
  if [ -n "$why" ]; then skip "$row" "$why"; return 0; fi
  case "$prec" in fp32) compute=float32 ;; bf16*) compute=bfloat16 ;; *) compute=float16 ;; esac
  # the row's type where CTranslate2 supports it on this device (CPUs: rarely float16 or bfloat16), else float32
  "$PYTHON" -c 'import ctranslate2, sys; sys.exit(sys.argv[2] not in ctranslate2.get_supported_compute_types(sys.argv[1]))' \
    "$DEVICE" "$compute" || compute=float32
  # torch's CUDA libraries (pip's nvidia-* packages), where CTranslate2 looks for cuBLAS and cuDNN
  local libs; libs=$("$PYTHON" -c 'import glob, os, sys
print(":".join(glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "nvidia", "*", "lib"))))') || libs=""
  local convert=("$PYTHON" -m user_dir.deploy.ct2_engine convert "$dir/1-kd/checkpoint_last.pt" --data "$DATA"
    --out "$row/model")
  local decode=("$PYTHON" "$WORK/bin/ct2_decode.py" "$row/model" "$DATA" "$DEVICE" "$compute")
  LD_LIBRARY_PATH="${libs:+$libs:}${LD_LIBRARY_PATH:-}" run_step "$row" "" \
    bash -c "$(printf '%q ' "${convert[@]}")&& $(printf '%q ' "${decode[@]}")" || true
}
# two launchers the rows use (the report shows them): ct2_engine's decoding on DEVICE (its command line has
# no --device), and fairseq-train with --bf16 off TPUs
write_launchers() {
  mkdir -p "$WORK/bin"
  cat > "$WORK/bin/ct2_decode.py" <<'PY'
"""CTranslate2 translation of a fairseq test set on a device: python ct2_decode.py MODEL DATA DEVICE COMPUTE_TYPE"""
import sys

from user_dir.tools import ct2_engine

model, data, device, compute_type = sys.argv[1:5]
task, batches = ct2_engine.load_batches(data, "test", 64)
lengths = ct2_engine._max_lengths(batches, 1.2, 10)  # as fairseq-generate --max-len-a 1.2 --max-len-b 10
decoded = ct2_engine.decode(model, batches, lengths, beam=5, compute_type=compute_type, device=device)
ct2_engine.write_generate_format(ct2_engine.hypotheses_as_text(task, batches, decoded, "subword_nmt"), sys.stdout)
print("ctranslate2", decoded["ctranslate2"], "on", device, compute_type, file=sys.stderr)
PY
}

say "3/4 rows (logs under $WORK/rows/)"
[ "$DRY_RUN" = 1 ] || write_launchers
for prec in $PRECISIONS; do
  for method in $METHODS; do
    for s in $(steps_of "$method"); do
      [ "$DRY_RUN" = 1 ] || { mkdir -p "$WORK/rows/$prec/$method/${s%%:*}"; echo "${s##*:}" > "$WORK/rows/$prec/$method/${s%%:*}/kind"; }
      if [[ " $PRECISIONS_RUN " != *" $prec "* ]]; then
        skip "$WORK/rows/$prec/$method/${s%%:*}" "not run on a CPU (fairseq's --$prec needs CUDA)"
      fi
    done
  done
done
for prec in $PRECISIONS_RUN; do
  for method in $METHODS; do
    if [ "$JOBS" -gt 1 ]; then
      while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
      chain "$prec" "$method" &
    else
      chain "$prec" "$method"
    fi
  done
done
wait
[ "$DRY_RUN" = 0 ] || exit 0

# ---- 4. the report ---------------------------------------------------------------------------------
REPORT="${OUT:-$WORK/gpu_check.md}"
say "4/4 report -> $REPORT"
status=0
"$PYTHON" scripts/maint/gpu_check_report.py "$WORK" --out "$REPORT" --command "$CMDLINE" --device "$DEVICE" \
  --jobs "$JOBS" --threads "$THREADS" || status=$?
if [ "$status" = 3 ]; then
  say "rows are left (time budget of $BUDGET s): the same command continues where this one stopped"
fi
exit "$status"
