#!/usr/bin/env bash
# Data-parallel fairseq-train over N ranks on this machine, or over several machines.
#
#   bash scripts/recipes/distributed_train.sh --nproc 2 -- DATA --user-dir user_dir --arch ... [fairseq-train flags]
#   # across 2 machines, 4 ranks each (run on each machine with its --node-rank):
#   bash scripts/recipes/distributed_train.sh --nproc 4 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 -- DATA ...
#
# CPU (default when no CUDA device is visible, or with --cpu): fairseq needs explicit flags to
# train data-parallel on CPUs -- without them it asserts, or exits 0 having trained nothing. This
# script starts one fairseq-train process per rank with
#   --distributed-world-size W --distributed-rank R --distributed-init-method tcp://ADDR:PORT
#   --distributed-no-spawn --distributed-backend gloo --ddp-backend legacy_ddp --cpu
# GPU: it hands the ranks to torchrun (one per GPU), which fairseq recognises from the environment.
# Rank 0 prints to the terminal; rank R>0 logs to $LOG_DIR/rank<R>.log (default: ./distributed-logs).
# The exit status is non-zero if any rank fails.
set -euo pipefail
NPROC=2; NNODES=1; NODE_RANK=0; MASTER_ADDR=127.0.0.1; MASTER_PORT="${MASTER_PORT:-29500}"; DEVICE=auto
LOG_DIR="${LOG_DIR:-distributed-logs}"
usage() { sed -n '2,17p' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc) NPROC="$2"; shift 2 ;;
    --nnodes) NNODES="$2"; shift 2 ;;
    --node-rank) NODE_RANK="$2"; shift 2 ;;
    --master-addr) MASTER_ADDR="$2"; shift 2 ;;
    --master-port) MASTER_PORT="$2"; shift 2 ;;
    --cpu) DEVICE=cpu; shift ;;
    --gpu) DEVICE=gpu; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "distributed_train.sh: unknown option $1 (put fairseq-train's arguments after --)" >&2; usage 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "distributed_train.sh: no fairseq-train arguments after --" >&2; usage 2; }
for v in NPROC NNODES NODE_RANK MASTER_PORT; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "distributed_train.sh: --$(echo $v | tr 'A-Z_' 'a-z-') must be a number, got '${!v}'" >&2; exit 2; }
done
[ "$NODE_RANK" -lt "$NNODES" ] || { echo "distributed_train.sh: --node-rank $NODE_RANK must be below --nnodes $NNODES" >&2; exit 2; }
PY="${PYTHON:-python}"
if [ "$DEVICE" = auto ]; then
  DEVICE=$("$PY" -c 'import torch; print("gpu" if torch.cuda.is_available() else "cpu")')
fi
WORLD=$((NPROC * NNODES))

if [ "$DEVICE" = gpu ]; then
  exec "$PY" -m torch.distributed.run --nproc-per-node "$NPROC" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" -m fairseq_cli.train "$@"
fi

mkdir -p "$LOG_DIR"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' INT TERM
for ((i = 0; i < NPROC; i++)); do
  rank=$((NODE_RANK * NPROC + i))
  cmd=("$PY" -m fairseq_cli.train "$@" --cpu --distributed-world-size "$WORLD" --distributed-rank "$rank"
       --distributed-init-method "tcp://$MASTER_ADDR:$MASTER_PORT" --distributed-no-spawn
       --distributed-backend gloo --ddp-backend legacy_ddp)
  if [ "$rank" -eq 0 ]; then "${cmd[@]}" & else "${cmd[@]}" > "$LOG_DIR/rank$rank.log" 2>&1 & fi
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
[ "$status" -eq 0 ] || echo "distributed_train.sh: a rank failed (exit $status); see $LOG_DIR/" >&2
exit "$status"
