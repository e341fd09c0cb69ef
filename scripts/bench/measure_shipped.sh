#!/usr/bin/env bash
# results/pet_multi30k.md from the shipped files alone: the teacher and the full-recipe PET student in
# checkpoints/multi30k.de-en/, measured on test_2016_flickr (prepared from the embedded corpus with the
# shipped BPE codes and dictionary) by the measurement command, reported by scripts/bench/pet_report.py with
# the student's validation NLL per KD epoch (pet_student_valid.log: the validation lines of its training log).
#
#   bash scripts/bench/measure_shipped.sh                       # -> results/pet_multi30k.md (+ .json)
#   OUT=work/shipped/pet.md RUNS=1 bash scripts/bench/measure_shipped.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SHIPPED=checkpoints/multi30k.de-en
WORK="${WORK:-work/shipped}"; OUT="${OUT:-results/pet_multi30k.md}"; PY="${VENV:-$ROOT/.venv}/bin/python"
for f in teacher.pt pet_student.pt code dict.de.txt pet_student_valid.log; do
  [ -f "$SHIPPED/$f" ] || { echo "measure_shipped.sh: no $SHIPPED/$f" >&2; exit 2; }
done
[ -f "$WORK/data-bin/test.de-en.de.bin" ] || "$PY" -m preprocess.prepare_multi30k --src de --tgt en \
  --dest "$WORK/data-bin" --bpe-codes "$SHIPPED/code" --srcdict "$SHIPPED/dict.de.txt"
"$PY" -m user_dir.tools.measure "$WORK/data-bin" --path "$SHIPPED/teacher.pt" "$SHIPPED/pet_student.pt" \
  --names teacher pet --raw-reference "$WORK/data-bin/text/test.raw.en" --beam 5 --batch-size 128 \
  --runs "${RUNS:-3}" --out "$WORK/measure.md" --json "$WORK/measure.json"
"$PY" scripts/bench/pet_report.py "$WORK" --train-log "$SHIPPED/pet_student_valid.log" --out "$OUT" \
  --command "bash scripts/bench/measure_shipped.sh" \
  --recipe "the shipped files: $SHIPPED/teacher.pt and $SHIPPED/pet_student.pt, made by WARMUP_EPOCHS=3 KD_EPOCHS=20 SEED=1 bash scripts/recipes/pet.sh work/pet-full (de->en; 3 epochs of warm-up on the simplified task, then 20 epochs of word-level KD from the warmed-up checkpoint; seed 1; student widths 128/96, 4+4 logical layers from 2+2 physical, pairs (1,3),(2,4), encoder Q<->K, decoder Q_self = Q_ed; the checkpoint of best validation loss; $SHIPPED/README.md)"
