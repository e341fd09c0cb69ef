#!/usr/bin/env bash
# Writes results/teacher_multi30k.md: the CPU-scale teacher trained by
# scripts/recipes/train_teacher_multi30k.sh, measured side by side with the project's reference teacher
# (../shared/teachers/multi30k.de-en, same recipe) when that is present.
#
#   bash scripts/recipes/train_teacher_multi30k.sh work/teacher-multi30k   # first (about an hour)
#   bash scripts/bench/bench_teacher.sh work/teacher-multi30k
# BENCH_NOTE="..." adds a remark on how the run went (e.g. a machine shared with other work).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${1:-$ROOT/work/teacher-multi30k}"
REFERENCE="${REFERENCE:-${FAIRSEQ_COMPRESS_SHARED:-$ROOT/../shared}/teachers/multi30k.de-en/teacher.pt}"
OUT="${OUT:-$ROOT/results/teacher_multi30k.md}"
CKPT="$WORK/checkpoints/checkpoint_best.pt"
[ -f "$CKPT" ] || { echo "bench_teacher.sh: no $CKPT; run scripts/recipes/train_teacher_multi30k.sh $WORK first" >&2; exit 2; }

paths=("$CKPT"); names=(teacher_ours)
if [ -f "$REFERENCE" ]; then paths+=("$REFERENCE"); names+=(teacher_reference); fi
python -m user_dir.tools.measure "$WORK/data-bin" --path "${paths[@]}" --names "${names[@]}" \
  --raw-reference "$WORK/data-bin/text/test.raw.en" --beam 5 --batch-size 128 --runs 3 \
  --out "$OUT.table" --json "${OUT%.md}.json"

{
  echo "# CPU-scale teacher: Transformer on Multi30k DE->EN, test_2016_flickr"
  echo
  echo "\`teacher_ours\`: trained here by \`bash scripts/recipes/train_teacher_multi30k.sh\` (checkpoint_best.pt, by"
  echo "validation loss). \`teacher_reference\`: the project's fixed reference teacher, made with the same recipe"
  echo "and data (our data pipeline reproduces its binarised files byte for byte; tests/test_preprocess_translation.py)."
  echo
  cat "$OUT.table"
  echo "## Training"
  echo
  echo "| model | epochs | updates | final valid loss (nll) | training wall time |"
  echo "|---|---|---|---|---|"
  python - "$WORK/train.log" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
valid = re.findall(r"valid on 'valid' subset \| loss ([\d.]+) \| nll_loss ([\d.]+).*?num_updates (\d+)", log)
epochs = re.findall(r"end of epoch (\d+)", log)
wall = re.search(r"training wall time: (\d+) s", log)
loss, nll, updates = valid[-1]
minutes = f"{int(wall.group(1)) / 60:.0f} min" if wall else "n/a (log has no end time)"
print(f"| teacher_ours | {epochs[-1]} | {updates} | {loss} ({nll}) | {minutes} |")
print("\nValidation nll_loss after each epoch: " + ", ".join(
    f"{n}" for n in re.findall(r"valid on 'valid' subset \| loss [\d.]+ \| nll_loss ([\d.]+)", log)))
PY
  echo
  echo "Log: \`$WORK/train.log\` (not committed). The reference teacher's own README gives 57 minutes, 8 epochs,"
  echo "1,951 updates on an idle 2-core machine."
  [ -z "${BENCH_NOTE:-}" ] || { echo; echo "$BENCH_NOTE"; }
} > "$OUT"
rm -f "$OUT.table"
echo "wrote $OUT"
